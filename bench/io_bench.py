"""IO benchmark: validate + pass-through throughput (records/s) and peak RSS vs input size.

    python bench/io_bench.py            # 100k and 1M records (~2 KB each, one trajectory)
    python bench/io_bench.py --quick    # 20k and 100k
    python bench/io_bench.py --quick --compare-src /tmp/base   # also the toolkit line at 100k on
                                        # another checkout, alternating 3 times: rec/s, CPU µs/record

Each case runs in a fresh subprocess fed through a pipe (no giant temp file), so ru_maxrss is
that run's peak. Baseline in the same run: a raw json.loads/json.dumps line copy without schema
validation. Flat memory = peak RSS at the large size within a few MB of the small size.
"""
import json
import os
import statistics
import subprocess
import sys
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from tests.conftest import make_record  # noqa: E402

CHILD = r"""
import resource, sys, time
sys.path.insert(0, %(root)r)
mode = sys.argv[1]
t = time.perf_counter()
if mode == "toolkit":
    from toolkit.io import IOOptions, RecordStream
    s = RecordStream(IOOptions(input=None, output="/dev/null", concurrency=64), "bench")
    s.run(lambda r: r)
    n = s.summary.written
else:
    import json
    n = 0
    with open("/dev/null", "w") as out:
        for line in sys.stdin.buffer:
            out.write(json.dumps(json.loads(line)) + "\n"); n += 1
dt = time.perf_counter() - t
print(n, dt, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024, file=sys.stderr)
"""


def feed(proc, n: int) -> None:
    tmpl = json.dumps(make_record(0, pad=1200))
    w = proc.stdin
    chunk = []
    for i in range(n):
        chunk.append(tmpl.replace("rec-0000000", f"rec-{i:07d}").replace('"R0"', f'"R{i}"'))
        if len(chunk) == 1000:
            w.write(("\n".join(chunk) + "\n").encode())
            chunk = []
    if chunk:
        w.write(("\n".join(chunk) + "\n").encode())
    w.close()


def run(mode: str, n: int, root: str = ROOT) -> tuple[int, float, int, float]:
    """(records, seconds, peak RSS MB, child CPU seconds) of one case in a fresh process."""
    p = subprocess.Popen([sys.executable, "-c", CHILD % {"root": root}, mode], stdin=subprocess.PIPE,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    t = threading.Thread(target=feed, args=(p, n))
    t.start()
    err = p.stderr.read().decode()
    t.join()
    _, _, ru = os.wait4(p.pid, 0)
    last = err.strip().splitlines()[-1]
    k, dt, rss = last.split()
    return int(k), float(dt), int(rss), ru.ru_utime + ru.ru_stime


def compare(src: str, n: int, reps: int = 3) -> None:
    """The toolkit line here and on the checkout `src`, alternating (a shared machine drifts)."""
    got: dict[str, list[tuple[float, float]]] = {"this": [], "src": []}
    for _ in range(reps):
        for name, root in (("src", src), ("this", ROOT)):
            k, dt, _rss, cpu = run("toolkit", n, root)
            assert k == n, (name, k, n)
            got[name].append((n / dt, cpu / n * 1e6))
    med = {k: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)) for k, v in got.items()}
    for name, label in (("src", src), ("this", "this checkout")):
        print(f"toolkit on {label}: {med[name][0]:,.0f} rec/s, {med[name][1]:.0f} CPU µs/record "
              f"(median of {reps}; CPU incl. start-up)")
    print(f"this / {src}: {med['this'][0] / med['src'][0]:.2f}x rec/s, {med['this'][1] / med['src'][1]:.2f}x CPU per record")


def main() -> None:
    sizes = (20_000, 100_000) if "--quick" in sys.argv else (100_000, 1_000_000)
    size_kb = len(json.dumps(make_record(0, pad=1200))) / 1024
    print(f"record size ≈ {size_kb:.1f} KB; sizes {sizes}")
    res = {}
    for n in sizes:
        for mode in ("raw-json", "toolkit"):
            k, dt, rss, _cpu = run(mode, n)
            assert k == n, (mode, k, n)
            res[(mode, n)] = (n / dt, rss)
            print(f"{mode:9s} n={n:>9,d}  {n/dt:>10,.0f} rec/s  {n*size_kb/1024/dt:7.1f} MB/s  peak RSS {rss:5d} MB")
    small, big = sizes
    print(f"toolkit / raw-json throughput at n={big:,}: {res[('toolkit', big)][0] / res[('raw-json', big)][0]:.2f}x")
    print(f"toolkit peak RSS growth {small:,} → {big:,}: {res[('toolkit', big)][1] - res[('toolkit', small)][1]:+d} MB "
          f"({res[('toolkit', big)][1] / res[('toolkit', small)][1]:.2f}x)")
    if "--compare-src" in sys.argv:
        compare(sys.argv[sys.argv.index("--compare-src") + 1], 100_000)  # start-up is noise at 100k


if __name__ == "__main__":
    main()
