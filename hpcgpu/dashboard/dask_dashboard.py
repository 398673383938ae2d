"""Registers the hpcgpu panels with the scheduler's running dask dashboard.

dask builds its dashboard once, when the scheduler starts: one Bokeh server
(``BokehTornado``) holding every page of ``distributed.dashboard.scheduler
.applications``, a menu from ``template_variables(scheduler)`` (``pages``,
the top bar; ``plots``, the "More..." list) and ``/individual-plots.json``
listing that server's ``individual-*`` paths for JupyterLab's dask extension.
The hpcgpu plugin arrives later, from a client, so it adds its documents to
that same server, the way the server adds each of dask's (one application
context and its routes: document, websocket, metadata, autoload, static),
and its entries to that same menu. The panels then sit beside Task Stream
everywhere dask lists its own: the menu, ``individual-plots.json``, the
JupyterLab extension.
"""

import functools
import logging

__all__ = ["add_to_dask_dashboard", "dask_bokeh_server"]

logger = logging.getLogger(__name__)

PAGE = "hpcgpu"  # the top bar's entry: the hpcgpu page (hpcgpu.dashboard.page)


def add_to_dask_dashboard(scheduler, plugin):
    """Serve the hpcgpu panels from ``scheduler``'s dashboard and list them in its menu.

    Adding them again (a second plugin on the same scheduler) keeps the
    panels already there.

    Parameters
    ----------
    scheduler : distributed.Scheduler
    plugin : hpcgpu.dashboard.plugin.DashboardPlugin
        What the panels show.

    Returns
    -------
    list of str
        The panels' paths; empty when the scheduler has no Bokeh dashboard.
    """
    from bokeh.application import Application
    from bokeh.application.handlers.function import FunctionHandler

    from hpcgpu.dashboard.panels import PANELS, panel_doc

    server = dask_bokeh_server(scheduler)
    if server is None:
        return []
    for path, (name, cls) in PANELS.items():
        if path not in server.app_paths:
            _add_application(server, path, Application(FunctionHandler(functools.partial(panel_doc, cls, name,
                                                                                          plugin))))
    _add_to_menu(scheduler, {path.strip("/"): name for path, (name, _) in PANELS.items()})
    return list(PANELS)


def dask_bokeh_server(scheduler):
    """The Bokeh server of ``scheduler``'s dashboard (the one ``individual-plots.json`` lists), or None."""
    from bokeh.server.tornado import BokehTornado

    http = getattr(scheduler, "http_application", None)
    return next((app for app in getattr(http, "applications", ()) if isinstance(app, BokehTornado)), None)


def _add_application(server, path, application):
    """Serve ``application`` at ``path`` from the running ``server``, as its constructor does for each of its own."""
    from bokeh.application.handlers.document_lifecycle import DocumentLifecycleHandler
    from bokeh.server.contexts import ApplicationContext
    from bokeh.server.tornado import create_static_handler
    from bokeh.server.urls import per_app_patterns

    application.add(DocumentLifecycleHandler())  # closes the documents' sessions cleanly, as for dask's pages
    logout_url = server.auth_provider.logout_url
    if logout_url is not None:
        logout_url = server._prefix + "/" + logout_url.lstrip("/")
    context = ApplicationContext(application, url=path, logout_url=logout_url)
    context._loop = server._loop  # what BokehTornado.initialize gives each context
    routes = [(server._prefix + path + suffix, handler, {"application_context": context})
              for suffix, handler in per_app_patterns]
    websocket = next(route for route, _, _ in routes if route.endswith("/ws"))
    for _, _, kwargs in routes:
        kwargs["bokeh_websocket_path"] = websocket
    routes.append(create_static_handler(server._prefix, path, application))
    server._applications[path] = context  # app_paths, hence individual-plots.json; closed with the server
    server.add_handlers(r".*$", routes)
    server._loop.add_callback(context.run_load_hook)


def _add_to_menu(scheduler, plots):
    """Add the page to dask's top bar and ``plots`` (url -> name) to its "More..." list.

    ``template_variables`` is memoized per scheduler and its lists are shared
    by every dask page's template, so the entries show on pages opened from
    now on.
    """
    from distributed.dashboard.scheduler import template_variables

    variables = template_variables(scheduler)
    if PAGE not in variables["pages"]:
        variables["pages"].append(PAGE)
    listed = {plot["url"] for plot in variables["plots"]}
    variables["plots"].extend({"url": url, "name": name} for url, name in plots.items() if url not in listed)
    variables["plots"].sort(key=lambda plot: plot["name"])  # dask's order: by name
