"""Pictures of 2D fields for the command line and reports (matplotlib, no display)."""

__all__ = ["save_panels"]


def save_panels(path, panels, *, title=None):
    """Save stacked colour maps of 2D fields as a PNG.

    Parameters
    ----------
    path : str or os.PathLike
    panels : sequence of dict
        Each with ``data`` (2D array), ``label`` (str), and optionally
        ``extent`` ``(x0, x1, y0, y1)``, ``cmap``, ``symmetric`` (centre the
        colour scale on zero) and ``xlabel`` / ``ylabel``.
    title : str, optional
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 3.4 * len(panels)), squeeze=False,
                             constrained_layout=True)
    for ax, panel in zip(axes[:, 0], panels):
        data = np.asarray(panel["data"], dtype=float)
        kwargs = {}
        if panel.get("symmetric"):
            bound = float(np.nanmax(np.abs(data))) or 1.0
            kwargs.update(vmin=-bound, vmax=bound)
        image = ax.imshow(data, origin="lower", extent=panel.get("extent"), aspect="auto",
                          cmap=panel.get("cmap", "viridis"), interpolation="nearest", **kwargs)
        ax.set_title(panel["label"])
        ax.set_xlabel(panel.get("xlabel", "x"))
        ax.set_ylabel(panel.get("ylabel", "y"))
        fig.colorbar(image, ax=ax)
    if title:
        fig.suptitle(title)
    fig.savefig(path, dpi=110)
    plt.close(fig)
