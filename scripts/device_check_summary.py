"""The summary of one device-check command, and the verdict of a rehearsal.

    python3 scripts/device_check_summary.py OUT [--rehearsal]
    python3 scripts/device_check_summary.py --verdict OUT1 OUT2 [...]

The first form reads ``OUT/stages.jsonl`` (one line per stage, written by
``scripts/device_check.sh``) and each stage's files under ``OUT`` and prints
a short summary: each stage's exit status, seconds and timeout, then the key
numbers (tests passed / failed / skipped and the failures, bench results,
the weather run). It needs only the standard library, and reads whatever a
killed stage left.

The second form checks a rehearsal (``scripts/device_check.sh rehearse``):
every stage ran and exited 0, except the stages that need CuPy (absent from
the rehearsal environment), which must end with a clean error row that
names CuPy and no traceback; the test tier collected every module without
an error, with the wheelhouse and (``bare-collection.log`` beside the OUT
folders) without it; each command's summary exists. It prints each stage's time next
to its timeout on the GPU, writes ``rehearsal.json`` beside the first OUT
and exits 1 if anything failed.
"""

import json
import os
import re
import sys
import xml.etree.ElementTree as ET

CUPY_STAGES = ("stencil-cupy", "nbody-cupy", "md-cupy", "matrix-cupy", "variants")
"""Stages that need CuPy; in a rehearsal (no CuPy) each must fail cleanly."""

HOST_STAGES = ("install", "info", "gpu-tests", "engine")
"""Stages whose rehearsal time is a fair estimate of (or more than) their time on the GPU machine:
installing, importing, collecting the test tier (whose GPU tests skip there), dask on CPUs. The
other stages run kernels under the CUDA simulator, which says nothing about their GPU time. Every
stage of a rehearsal runs under its GPU timeout (the same plan), so an overrun fails it."""

STARVED_CPU_SHARE = 0.5
"""A stage that used less than this share of one CPU while it ran waited for the CPUs, mostly:
the CUDA simulator's Python threads are CPU-bound, so on a shared machine whose other work runs at
a higher priority (a niced run beside a plain one) its time grows with the load, not with the
work (docs/journal.md, "The rehearsal")."""


def cpu_note(stage):
    """'CPU x s (y% of one core)', and a warning when the stage mostly waited for the CPUs."""
    cpu, wall = stage.get("cpu_seconds"), stage.get("seconds") or 0
    if cpu is None or wall <= 0:
        return ""
    share = cpu / wall
    note = f"CPU {cpu:.1f} s ({share:.0%} of one core)"
    if share < STARVED_CPU_SHARE and wall >= 5:
        note += ": it mostly waited for the CPUs (a busy machine)"
    return note

_OUTCOME = re.compile(r"^(tests/\S+::\S+(?:\[.*?\])?) (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\b")
_COLLECT_ERROR = re.compile(r"ERROR collecting (\S+)")


def read_jsonl(path):
    """The JSON objects of ``path``, one per line; lines that do not parse (a write cut short) are left out."""
    rows = []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError:
                        pass
    except OSError:
        pass
    return rows


def _read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def tier_results(out):
    """Outcome of the test tier from its junit XML (complete) or, failing that, its ``-v`` log.

    Returns a dict: ``source``, ``counts`` (passed, failed, errors, skipped), ``failed`` (test ids
    with a line of why), ``collection_errors`` (paths), ``nccl`` (counts of tests/partition/test_nccl.py).
    """
    log = _read(os.path.join(out, "gpu-tests.log"))
    collection = sorted(set(_COLLECT_ERROR.findall(log)))
    result = dict(source=None, counts={}, failed=[], collection_errors=collection, nccl={})
    xml = os.path.join(out, "gpu-tests.xml")
    cases = []
    if os.path.exists(xml):
        try:
            root = ET.parse(xml).getroot()
            for case in root.iter("testcase"):
                outcome, why = "passed", ""
                for child in case:
                    if child.tag in ("failure", "error", "skipped"):
                        outcome = {"failure": "failed", "error": "errors", "skipped": "skipped"}[child.tag]
                        why = (child.get("message") or "").splitlines()[0][:200] if child.get("message") else ""
                        break
                name = f"{case.get('classname', '')}::{case.get('name', '')}"
                if outcome == "errors" and "collection failure" in why:
                    path = case.get("name", "")
                    if path not in collection:
                        collection.append(path)
                cases.append((name, outcome, why))
            result["source"] = "junit"
        except ET.ParseError:
            cases = []
    if not cases and log:
        seen = {}
        for line in log.splitlines():
            m = _OUTCOME.match(line)
            if m:
                outcome = {"PASSED": "passed", "FAILED": "failed", "SKIPPED": "skipped", "ERROR": "errors",
                           "XFAIL": "skipped", "XPASS": "passed"}[m.group(2)]
                seen[m.group(1)] = outcome
        cases = [(name, outcome, "") for name, outcome in seen.items()]
        result["source"] = "log (no junit XML: the tier was killed)" if cases else None
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    nccl = dict(counts)
    for name, outcome, why in cases:
        counts[outcome] += 1
        if "test_nccl" in name:
            nccl[outcome] += 1
        if outcome in ("failed", "errors"):
            result["failed"].append(f"{name}: {why}" if why else name)
    result["counts"], result["nccl"] = counts, nccl
    m = re.findall(r"^=+ (.*(?:passed|failed|skipped|error|deselected|no tests ran).*) =+$", log, re.M)
    result["pytest_line"] = m[-1] if m else None
    return result


def _number(value):
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


_EXTRA = ("fraction_of_copy", "fraction_of_cublas", "fraction_of_peak", "gb_per_s", "gflops", "relative_error",
          "transport", "workers")


def bench_lines(rows, limit=24):
    """One line per bench row: case, backend, dtype, size, value and unit, and the ratios it carries."""
    lines = []
    for r in rows[:limit]:
        who = " ".join(str(r.get(k)) for k in ("case", "backend", "dtype", "size") if r.get(k) is not None)
        if r.get("error"):
            lines.append(f"{who or r.get('suite', '')} ERROR {str(r['error'])[:240]}")
            continue
        extra = "  ".join(f"{k} {_number(r[k])}" for k in _EXTRA if r.get(k) is not None)
        lines.append(f"{who}: {_number(r.get('value'))} {r.get('unit', '')}  {extra}".rstrip())
    if len(rows) > limit:
        lines.append(f"... and {len(rows) - limit} more lines")
    return lines


def variants_lines(rows):
    if not rows:
        return ["no rows"]
    status = {}
    for r in rows:
        status[r.get("status")] = status.get(r.get("status"), 0) + 1
    lines = [", ".join(f"{n} {s}" for s, n in sorted(status.items(), key=lambda x: str(x[0])))]
    best = {}
    for r in rows:
        if r.get("status") == "ok":
            key = (r["backend"], r["case"], r["dtype"])
            if key not in best or r["copy"] > best[key]["copy"]:
                best[key] = r
    for (backend, case, dtype), r in sorted(best.items()):
        lines.append(f"best {backend} {case} {dtype}: {r['launch']}{' (default)' if r.get('default') else ''} "
                     f"{r['gpts']:.1f} G/s, {r['copy']:.0%} of copy")
    for r in rows:
        if r.get("status") in ("error", "mismatch"):
            who = " ".join(str(r[k]) for k in ("backend", "case", "dtype", "launch") if r.get(k) is not None)
            lines.append(f"{r['status'].upper()} {who}: {str(r.get('error') or r.get('check'))[:200]}")
    return lines


def _first_line(text, pattern):
    for line in text.splitlines():
        if re.search(pattern, line):
            return line.strip()
    return None


def summarize(out, rehearsal=False):
    stages = read_jsonl(os.path.join(out, "stages.jsonl"))
    command = stages[0]["command"] if stages else "?"
    total = sum(s.get("seconds") or 0 for s in stages)
    lines = [f"device check, command {command}{' (REHEARSAL: CUDA simulator, tiny sizes)' if rehearsal else ''}: "
             f"{len(stages)} stages, {total:.0f} s",
             f"{'stage':14s} {'status':>6s} {'seconds':>8s} {'CPU s':>6s} {'timeout':>8s}  note"]
    for s in stages:
        status = "skip" if s.get("status") is None else str(s["status"])
        cpu = "-" if s.get("cpu_seconds") is None else f"{s['cpu_seconds']:.1f}"
        lines.append(f"{s['stage']:14s} {status:>6s} {s.get('seconds', 0):8.1f} {cpu:>6s} {s.get('timeout', 0):8d}  "
                     f"{s.get('note', '')}")
    lines.append("")
    for s in stages:
        name = s["stage"]
        if name == "install":
            log = _read(os.path.join(out, "install.log"))
            for pattern in ("installing", "imports|cannot import", "hpcgpu from"):
                found = _first_line(log, pattern)
                if found:
                    lines.append(f"install: {found[:300]}")
            bad = _first_line(log, "ERROR|Error")
            if bad:
                lines.append(f"install: {bad[:300]}")
        elif name == "info":
            log = _read(os.path.join(out, "info.log"))
            for pattern in (r"^GPU \d", "no nvidia-smi", r"^python ", "'auto' selects", r"^\s+(cuda|cupy)\s"):
                found = _first_line(log, pattern)
                if found:
                    lines.append(f"info: {found}")
        elif name == "gpu-tests":
            t = tier_results(out)
            c = t["counts"]
            lines.append(f"gpu-tests: {c.get('passed', 0)} passed, {c.get('failed', 0)} failed, "
                         f"{c.get('errors', 0)} errors, {c.get('skipped', 0)} skipped; "
                         f"{len(t['collection_errors'])} collection errors (from {t['source']})")
            if t["pytest_line"]:
                lines.append(f"  pytest: {t['pytest_line']}")
            for path in t["collection_errors"]:
                lines.append(f"  COLLECTION ERROR {path}")
            for failed in t["failed"][:20]:
                lines.append(f"  FAILED {failed[:300]}")
            if len(t["failed"]) > 20:
                lines.append(f"  ... and {len(t['failed']) - 20} more (gpu-tests.xml, gpu-tests.log)")
            n = t["nccl"]
            if any(n.values()):
                lines.append(f"  engine (tests/partition/test_nccl.py): {n['passed']} passed, {n['failed']} failed, "
                             f"{n['errors']} errors, {n['skipped']} skipped")
        elif name == "variants":
            lines += [f"variants: {line}" for line in variants_lines(read_jsonl(os.path.join(out, "variants.jsonl")))]
        elif name == "weather":
            summary = os.path.join(out, "weather-summary.json")
            if os.path.exists(summary):
                try:
                    data = json.load(open(summary))
                    keys = [k for k in ("steps", "model_time", "wall_s", "steps_per_s", "point_updates_per_s",
                                        "backend", "dtype", "nx", "ny") if k in data]
                    lines.append("weather: " + ", ".join(f"{k} {_number(data[k])}" for k in keys))
                except (OSError, ValueError) as error:
                    lines.append(f"weather: summary.json unreadable ({error})")
            else:
                tail = [x for x in _read(os.path.join(out, "weather.log")).splitlines() if x.strip()][-3:]
                lines.append("weather: no summary.json; " + " | ".join(tail)[:400])
        else:
            rows = read_jsonl(os.path.join(out, f"{name}.jsonl"))
            lines += [f"{name}: {line}" for line in (bench_lines(rows) or ["no result lines"])]
    return "\n".join(lines)


def _clean_cupy_failure(out, stage):
    """Whether a CuPy stage of a rehearsal failed the expected way: an error row naming CuPy, no traceback."""
    name = stage["stage"]
    rows = read_jsonl(os.path.join(out, f"{name}.jsonl"))
    log = _read(os.path.join(out, f"{name}.log"))
    errors = [str(r.get("error", "")) for r in rows if r.get("error")]
    return bool(errors) and all("cupy" in e.lower() for e in errors) and "Traceback" not in log


def verdict(outs):
    """Check a rehearsal's command folders; returns (ok, report text, data)."""
    problems, table = [], []
    for out in outs:
        stages = read_jsonl(os.path.join(out, "stages.jsonl"))
        if not stages:
            problems.append(f"{out}: no stages.jsonl")
            continue
        if not os.path.exists(os.path.join(out, "summary.txt")):
            problems.append(f"{out}: no summary.txt")
        for s in stages:
            name, status = s["stage"], s.get("status")
            expected = "0"
            if status is None:
                ok = False
                problems.append(f"command {s['command']} {name}: skipped ({s.get('note')})")
            elif status in (124, 137) or "timed out" in (s.get("note") or ""):
                ok = False
                why = cpu_note(s)
                problems.append(f"command {s['command']} {name}: timed out after {s.get('seconds')} s"
                                + (f" ({why})" if why else ""))
            elif name in CUPY_STAGES:
                expected = "0 or a clean 'no CuPy' error"
                ok = status == 0 or _clean_cupy_failure(out, s)
                if not ok:
                    problems.append(f"command {s['command']} {name}: exit status {status} without a clean "
                                    f"error row naming CuPy (see {name}.log)")
            else:
                ok = status == 0
                if not ok:
                    problems.append(f"command {s['command']} {name}: exit status {status} (see {name}.log)")
            if name in HOST_STAGES and s.get("planned") and (s.get("seconds") or 0) > s["planned"]:
                ok = False
                problems.append(f"command {s['command']} {name}: {s['seconds']} s here, over its "
                                f"{s['planned']} s timeout on the GPU")
            table.append(dict(command=s["command"], stage=name, status=status, seconds=s.get("seconds"),
                              cpu_seconds=s.get("cpu_seconds"),
                              gpu_timeout=s.get("planned"), expected=expected, ok=ok))
        if any(s["stage"] == "gpu-tests" for s in stages):
            t = tier_results(out)
            if t["collection_errors"]:
                problems.append(f"gpu-tests: collection errors in {', '.join(t['collection_errors'])}")
            if t["source"] is None:
                problems.append("gpu-tests: no test results (no junit XML, no -v lines)")
            for failed in t["failed"]:
                problems.append(f"gpu-tests: {failed}")
    bare = os.path.join(os.path.dirname(os.path.abspath(outs[0])), "bare-collection.log") if outs else ""
    if bare and os.path.exists(bare):
        log = _read(bare)
        errors = sorted(set(_COLLECT_ERROR.findall(log)))
        if errors or "exit status 0" not in log:
            problems.append("collecting the GPU tier on a bare image (no wheelhouse): "
                            + (", ".join(errors) if errors else log.strip().splitlines()[-1]))
    lines = ["rehearsal of the device check: each stage's time here (CUDA simulator, tiny sizes) next to its "
             "timeout on the GPU",
             f"{'cmd':3s} {'stage':14s} {'status':>6s} {'seconds':>8s} {'CPU s':>6s} {'GPU timeout':>11s} "
             f"{'share':>6s}  ok"]
    for row in table:
        share = (row["seconds"] or 0) / row["gpu_timeout"] if row["gpu_timeout"] else 0
        cpu = "-" if row.get("cpu_seconds") is None else f"{row['cpu_seconds']:.1f}"
        lines.append(f"{row['command']:3s} {row['stage']:14s} {str(row['status']):>6s} {row['seconds'] or 0:8.1f} "
                     f"{cpu:>6s} "
                     f"{row['gpu_timeout'] or 0:11d} {share:6.0%}  {'yes' if row['ok'] else 'NO'}"
                     f"{'' if row['stage'] in HOST_STAGES else '  (simulator: not a GPU time)'}")
    lines.append("")
    lines += [f"PROBLEM: {p}" for p in problems] or ["rehearsal passed: every stage finished as expected, "
                                                     "the test tier collected without errors"]
    return not problems, "\n".join(lines), dict(ok=not problems, stages=table, problems=problems)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--verdict":
        outs = argv[1:]
        ok, text, data = verdict(outs)
        print(text)
        with open(os.path.join(os.path.dirname(os.path.abspath(outs[0])), "rehearsal.json"), "w") as f:
            json.dump(data, f, indent=1)
        return 0 if ok else 1
    if not argv:
        print(__doc__)
        return 2
    print(summarize(argv[0], rehearsal="--rehearsal" in argv[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
