"""A kernel's PM-sampling timeline from ncu (issue 17, s10-soft16): DRAM read and write
throughput, the XU pipe (MUFU: exps), L2 hit rate and CTA launches per sample, over the
samples where SMs are active, and the mean DRAM throughput of its first and last samples
against the rest (a launch's first wave and drain against its steady state).

    ncu --section PmSampling ... -o REPORT python ...
    ncu -i REPORT.ncu-rep --page raw --csv --print-metric-instances values > RAW.csv
    python benchmarks/ncu_timeline.py RAW.csv [--duration-us US] [--edge N]

``--duration-us``: the kernel's duration (ncu's gpu__time_duration), to print sample times;
``--edge``: samples counted as the first wave and as the drain (default 18 and 13, the ticket
kernel's at 64x1000003 bf16 on an H100).
"""

from __future__ import annotations

import argparse
import csv

SERIES = {
    "read": "dramc__read_throughput.avg.pct_of_peak_sustained_elapsed",
    "write": "dramc__write_throughput.avg.pct_of_peak_sustained_elapsed",
    "xu": "sm__inst_executed_pipe_xu_realtime.avg.pct_of_peak_sustained_elapsed",
    "l2hit": "lts__average_t_sector_hit_rate_realtime.pct",
    "ctas": "gr__ctas_launched_realtime.sum",
    "active": "sm__cycles_active.avg",
}


def series(path: str) -> dict[str, list[float]]:
    """The PM-sampling series of the report's first kernel (metric -> one value a sample)."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    found = {}
    for name, value in zip(rows[0], rows[2]):
        if ".TriageCompute." not in name or "(" not in value:
            continue
        values = value[value.index("(") + 1:value.rindex(")")].split(";")
        found[name.split(".TriageCompute.", 1)[1]] = [float(v.replace(",", "")) for v in values]
    missing = [m for m in SERIES.values() if m not in found]
    if missing:
        raise SystemExit(f"{path}: no PM-sampling series {missing} (ncu --section PmSampling)")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw")
    parser.add_argument("--duration-us", type=float)
    parser.add_argument("--first", type=int, default=18)
    parser.add_argument("--drain", type=int, default=13)
    args = parser.parse_args()
    found = series(args.raw)
    s = {key: found[metric] for key, metric in SERIES.items()}
    active = [i for i, v in enumerate(s["active"]) if v > 0]
    lo, hi = active[0], active[-1]
    n = hi - lo + 1
    step = args.duration_us / n if args.duration_us else 0.0
    print(f"{n} samples" + (f", {step:.2f} us each" if step else ""))
    print(f"{'sample':>6} {'t_us':>6} {'read%':>6} {'write%':>6} {'r+w%':>6} {'xu%':>5} "
          f"{'l2hit%':>6} {'ctas':>5}")
    for k, i in enumerate(range(lo, hi + 1)):
        print(f"{k:>6} {k * step:>6.1f} {s['read'][i]:>6.1f} {s['write'][i]:>6.1f} "
              f"{s['read'][i] + s['write'][i]:>6.1f} {s['xu'][i]:>5.1f} {s['l2hit'][i]:>6.1f} "
              f"{s['ctas'][i]:>5.0f}")
    for name, a, b in (("first wave", lo, lo + args.first - 1),
                       ("steady", lo + args.first, hi - args.drain),
                       ("drain", hi - args.drain + 1, hi)):
        k = b - a + 1
        read = sum(s["read"][a:b + 1]) / k
        write = sum(s["write"][a:b + 1]) / k
        print(f"{name:>10}: {k} samples" + (f" ({k * step:.1f} us)" if step else "")
              + f", DRAM read {read:.1f} + write {write:.1f} = {read + write:.1f}% of peak")


if __name__ == "__main__":
    main()
