"""A second look at outliers: a worker or pair below its peers is measured again before it is judged.

Cluster acceptance compares each worker's kernel rates with the median of
its peers, and each pair's transfer bandwidth with the median of the other
pairs. One timed run decides nothing on a shared machine: on this 2-core
VM a healthy worker's Lennard-Jones rate came out at 56% of its peer's in
one run of ``hpcgpu bench --quick``, and a pair's task-path bandwidth at
40% in another, while the next runs passed. A slow worker (a throttled GPU,
a bad memory channel) is slow every time; a slow spell of the host is not.
So whatever falls below its threshold is measured once more, the faster of
its runs is judged, and the record keeps both (``rates_measured``,
``bandwidths_measured``). A faster second run raises the median the others
are judged by, so the caller looks again at whoever is then below it; each
worker or pair is measured at most twice. Correctness is never taken from the better run:
a kernel check passes only if every run passed.

Examples
--------
>>> first = {"a": [{"family": "md", "rate": 1.0, "passed": True}],
...          "b": [{"family": "md", "rate": 0.5, "passed": True}]}
>>> below_peers(first, 0.7)
['b']
>>> keep_faster(first["b"], [{"family": "md", "rate": 0.95, "passed": True}])
[{'family': 'md', 'rate': 0.95, 'passed': True, 'rates_measured': [0.5, 0.95]}]
"""

import math
import statistics

__all__ = ["below_peers", "keep_faster", "look_again", "pairs_below_peers"]


def _rates(checks):
    """``{family: rate}`` of one worker's kernel checks (finite rates only)."""
    return {c["family"]: c["rate"] for c in checks
            if isinstance(c.get("rate"), (int, float)) and math.isfinite(c["rate"])}


def below_peers(runs, fraction):
    """Workers with a kernel rate below ``fraction`` of the median of the other workers' rates of that family.

    ``runs`` maps each worker to its list of kernel-check records (``family``
    and ``rate``); workers whose probes failed (a dict with ``error``) are
    left out.
    """
    rates = {w: _rates(checks) for w, checks in runs.items() if isinstance(checks, list)}
    slow = []
    for worker, own in rates.items():
        for family, rate in own.items():
            peers = [r[family] for w, r in rates.items() if w != worker and family in r]
            if peers and rate < fraction * statistics.median(peers):
                slow.append(worker)
                break
    return sorted(slow)


def keep_faster(first, second):
    """Per family, the faster of two runs of a worker's kernel checks; ``passed`` only if both passed.

    Families missing from ``second`` keep their first record.
    """
    again = {c.get("family"): c for c in second if isinstance(c, dict)}
    kept = []
    for check in first:
        other = again.get(check.get("family"))
        if other is None:
            kept.append(check)
            continue
        rates = [check.get("rate"), other.get("rate")]
        faster = other if (other.get("rate") or 0.0) > (check.get("rate") or 0.0) else check
        kept.append({**faster, "passed": bool(check.get("passed")) and bool(other.get("passed")),
                     "rates_measured": rates})
    return kept


def look_again(below, measure_again):
    """Call ``measure_again(names)`` for whoever ``below()`` names that was not looked at yet, until none is new.

    ``below`` reads the caller's current results and ``measure_again``
    updates them; a faster second run raises the peers' median, so the
    others are looked at again after it. Each name is measured again at
    most once.

    Examples
    --------
    >>> rates = {"a": 1.0, "b": 0.2}
    >>> look_again(lambda: [k for k, v in rates.items() if v < 0.5], lambda names: rates.update(b=0.9))
    >>> rates
    {'a': 1.0, 'b': 0.9}
    """
    looked = set()
    while slow := [name for name in below() if name not in looked]:
        looked.update(slow)
        measure_again(slow)


def pairs_below_peers(bandwidths, fraction):
    """Pairs whose bandwidth is below ``fraction`` of the median of the other pairs' (finite ones only)."""
    finite = {pair: value for pair, value in bandwidths.items() if math.isfinite(value)}
    slow = []
    for pair, value in finite.items():
        others = [v for p, v in finite.items() if p != pair]
        if others and value < fraction * statistics.median(others):
            slow.append(pair)
    return sorted(slow)
