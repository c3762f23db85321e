"""A rollout judged on the devices' answers (issue 29): 1,000 simulated devices, a
canary wave of 10 % (waves 10 %, 50 %, 100 %, an hour's soak each), the channel
declaring ``shadow:`` and ``rollout.stop.min_agreement``, played twice by ``fleet
advance``: once for a version whose answers keep the previous version's top class on
about four rows in five (it must be held at its first wave, the hold committed with its
figures), once for a faithful one (about 99.9 %: it must reach 100 %).  ``--quick``:
200 devices.  About 35 s, most of it in ``modelreg ci release`` (one per wave).

The devices, their comparisons and the simulated clock: ``benchmarks._fleet_behaviour``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any, Final

from benchmarks._fleet_behaviour import DISAGREEING, FAITHFUL, simulate, summary_lines
from benchmarks._util import BENCH_DIR, BenchmarkError, busy_warning, machine_info

NAME: Final = "fleet_behaviour"
FULL_DEVICES: Final = 1000
QUICK_DEVICES: Final = 200


def _goal(name: str, value: float, *, indicative: bool) -> dict[str, Any]:
    return {"name": name, "value": value, "target": 0, "comparison": "<=",
            "passed": value <= 0, "indicative": indicative}  # fmt: skip


def goals(runs: Mapping[str, Mapping[str, Any]], *, indicative: bool) -> list[dict[str, Any]]:
    """What the scenario must show: the disagreeing version held at its first wave with
    its figures committed, the faithful one at 100 % on every device."""
    out = []
    bad = runs.get(DISAGREEING.label)
    if bad is not None:
        commit = bad["hold_commit"] or {}
        figures = bool(bad["hold"]) and "agreement" in bad["hold"] and "compared" in bad["hold"]
        committed = figures and bad["hold"] in commit.get("body", "")
        out += [
            _goal("behaviour, disagreeing: waves taken past the first",
                  len(bad["waves_reached"]) - 1, indicative=indicative),
            _goal("behaviour, disagreeing: hold not committed with its figures",
                  0 if committed else 1, indicative=indicative),
        ]  # fmt: skip
    good = runs.get(FAITHFUL.label)
    if good is not None:
        out += [
            _goal("behaviour, faithful: percent short of 100", 100 - good["percent"],
                  indicative=indicative),
            _goal("behaviour, faithful: devices not on the version",
                  good["devices"] - good["devices_on_new"], indicative=indicative),
        ]  # fmt: skip
    return out


def run(quick: bool) -> dict[str, Any]:
    """The scenario at 1,000 devices (``quick``: 200).

    Raises:
        BenchmarkError: a command failed.
    """
    devices = QUICK_DEVICES if quick else FULL_DEVICES
    warning = busy_warning()
    runs = simulate(devices, BENCH_DIR / NAME / ("quick" if quick else "full"))
    notes = ([] if warning is None else [warning]) + summary_lines(runs)
    return {
        "name": NAME,
        "quick": quick,
        "summary": f"{devices} devices, waves 10/50/100 %, a disagreeing and a faithful "
        "version rolled out by fleet advance",
        "params": {"devices": devices},
        "measurements": {},
        "runs": runs,
        "notes": notes,
        "goals": goals(runs, indicative=quick),
        "environment": machine_info(),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.fleet_behaviour [--devices N]``: the runs, as JSON and lines."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fleet_behaviour")
    parser.add_argument("--devices", type=int, default=FULL_DEVICES)
    args = parser.parse_args(argv)
    work = BENCH_DIR / NAME / "dev"
    try:
        runs = simulate(args.devices, work)
    except BenchmarkError as e:
        print(f"fleet_behaviour: {e}", file=sys.stderr)
        return 1
    out = work / "runs.json"
    out.write_text(json.dumps(runs, indent=1), encoding="utf-8")
    print(f"runs written to {out}")
    print("\n".join(summary_lines(runs)))
    for g in goals(runs, indicative=False):
        print(("PASS" if g["passed"] else "FAIL"), g["name"], g["value"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
