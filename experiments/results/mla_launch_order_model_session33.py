"""List-scheduling model of the Mosaic GPU MLA kernel's CTAs at 16k Q 16 (BENCHMARKS.md, issue 5,
session 33): 66 cluster slots (132 SMs, clusters of two), 8 cluster row blocks per stream, a CTA
takes 7 us + 3.5 us per 128-key pair (session 22's fixed and per-pair costs; 453 us at equal 16k
S 8 unsplit), the merge 22 us. Runs per stream by run_schedule's cumulative rounding ("cum") or
by highest averages ("dhondt"); CTAs launched in grid order (row block by row block) or longest
first. Prints the modelled time per (S, contexts) and form. Run: python3 <this file> (CPU)."""
import heapq

FIX, PER_PAIR, MERGE, SLOTS, BLOCKS = 7.0, 3.5, 22.0, 66, 8


def lengths(ctx, num_s, kind):
    return [ctx] * num_s if kind == "uniform" else [ctx * (2 * i + 1) // num_s for i in range(num_s)]


def cum(totals, width):
    spare, u, c, b = width - len(totals), sum(totals), 0, []
    for t in [0] + totals:
        c += t
        b.append((2 * spare * c + u) // (2 * u))
    return [1 + b[j + 1] - b[j] for j in range(len(totals))]


def dhondt(totals, width):
    count = [1] * len(totals)
    for _ in range(width - len(totals)):
        j = max(range(len(totals)), key=lambda j: totals[j] / count[j])
        count[j] += 1
    return count


def makespan(jobs):
    free, end = [0.0] * SLOTS, 0.0
    for d in jobs:
        t = heapq.heappop(free)
        heapq.heappush(free, t + d)
        end = max(end, t + d)
    return end


def model(ctx, num_s, kind, splits, alloc, order):
    totals = [n // 128 + 1 for n in lengths(ctx, num_s, kind)]
    count = [1] * num_s if splits == 1 else alloc(totals, num_s * splits)
    runs = [t // c + (k >= c - t % c) for t, c in zip(totals, count) for k in range(c)]
    jobs = [FIX + PER_PAIR * p for _ in range(BLOCKS) for p in runs]
    if order == "longest":
        jobs.sort(reverse=True)
    return makespan(jobs) + (MERGE if splits > 1 else 0.0)


if __name__ == "__main__":
    forms = [(1, None, "grid"), (1, None, "longest"), (2, cum, "grid"), (2, dhondt, "grid"),
             (2, cum, "longest"), (3, dhondt, "longest"), (4, dhondt, "longest")]
    for num_s in (8, 16):
        for kind in ("uniform", "spread"):
            cells = [f"{k}{a.__name__ if a else ''}/{o}={model(16384, num_s, kind, k, a, o):.0f}" for k, a, o in forms]
            print(f"S={num_s:2d} {kind:7s} " + " ".join(cells))
