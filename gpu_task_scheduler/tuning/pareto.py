"""Pareto ranking, all objectives minimized: which points dominate which, the non-dominated fronts,
NSGA-II's crowding distance, and the orders the several-objective rules judge by (MO-ASHA's
standing of one run, the pausing methods' and population-based training's ranking of a rung).
Pure, and with no imports of gts's own: ``results.py`` (``gts results --pareto``, the page) and the
rules (``stopping.py``, ``trials.py``, ``pbt.py``) share it.
"""

from __future__ import annotations

import math
import operator
from bisect import bisect_left
from collections.abc import Sequence


def _crowding(front: Sequence[int], points: Sequence[Sequence[float]]) -> dict[int, float]:
    """NSGA-II's crowding distance of each point of a front: the ends infinite, the rest the sum
    over the objectives of the gap between their neighbours, over the front's span."""
    distance = dict.fromkeys(front, 0.0)
    for k in range(len(points[front[0]])):
        ranked = sorted(front, key=lambda i: points[i][k])
        span = points[ranked[-1]][k] - points[ranked[0]][k]
        distance[ranked[0]] = distance[ranked[-1]] = math.inf
        for a, b, c in zip(ranked, ranked[1:], ranked[2:], strict=False):
            if span > 0:
                distance[b] += (points[c][k] - points[a][k]) / span
    return distance


def fronts(points: Sequence[Sequence[float]]) -> list[list[int]]:
    """The indices of ``points`` (all objectives minimized) by non-dominated front, the first front
    first (equal points share one).

    The points are taken in lexicographic order, so that none is dominated by one taken after it,
    and each joins the first front that holds no point dominating it. Whether a front holds one
    only changes once along the fronts (a point of a later front that dominated it would be
    dominated by one of every front before, which would dominate it too), so the front is found by
    bisection (Zhang et al., "ENS-BS", 2015). Two objectives need not look at a front's points: a
    front's points so far dominate the point exactly when the lowest second objective among them
    is below the point's (or equal to it at a lower first objective), and those lowest values grow
    from front to front. 2,000 random points take 3 ms with two objectives, 60 ms with three and
    137 ms with four (2 cores; peeling a front at a time took 670 ms with three).

    >>> fronts([[3, 3], [1, 4], [2, 2], [4, 1], [3, 3]]), fronts([[3, 3, 0], [1, 4, 0], [2, 2, 0], [4, 1, 0]])
    ([[1, 2, 3], [0, 4]], [[1, 2, 3], [0]])
    """
    found: list[list[int]] = []
    ordered = sorted(range(len(points)), key=lambda i: (tuple(points[i]), i))
    if points and len(points[0]) == 2:
        lowest: list[tuple[float, float]] = []  # each front's lowest (second, first) objective so far
        for i in ordered:
            x, y = points[i]
            k = bisect_left(lowest, (y, x))  # the fronts before k each hold a point that dominates it
            if k == len(lowest):
                lowest.append((y, x))
                found.append([i])
            else:
                lowest[k] = (y, x)
                found[k].append(i)
        return found
    rows = [tuple(point) for point in points]
    for i in ordered:
        point, low, high = rows[i], 0, len(found)
        while low < high:
            middle = (low + high) // 2
            # Taken before it, a point dominates it when it is no worse in every objective and not
            # the same point; the front's latest points first: the likeliest to (ENS).
            if any(all(map(operator.le, rows[j], point)) and rows[j] != point for j in reversed(found[middle])):
                low = middle + 1
            else:
                high = middle
        if low == len(found):
            found.append([i])
        else:
            found[low].append(i)
    return found


def standing_of(last: int, points: Sequence[Sequence[float]]) -> tuple[int, int]:
    """Point ``last``'s non-dominated rank (0: the front) and how many points are strictly ahead of
    it: every point of a lower rank, and those of its own front that are more isolated (a larger
    crowding distance).

    >>> standing_of(3, [[3, 3], [1, 4], [2, 2], [4, 1]]), standing_of(2, [[3, 3], [1, 4], [2, 2], [4, 1]])
    ((0, 0), (0, 2))
    >>> standing_of(0, [[3, 3], [1, 4], [2, 2], [4, 1]])
    (1, 3)
    """
    ahead = 0
    for rank, front in enumerate(fronts(points)):
        if last in front:
            distance = _crowding(front, points)
            return rank, ahead + sum(1 for i in front if distance[i] > distance[last])
        ahead += len(front)
    raise ValueError(f"no point {last} among {len(points)}")


def pareto_order(points: Sequence[Sequence[float]]) -> list[int]:
    """The indices of ``points`` (all objectives minimized) best first, as NSGA-II and MO-ASHA rank
    them: by non-dominated front, within a front the more isolated first (a larger crowding
    distance; the ends of a front first). Equally isolated points (the two ends of a front, whose
    distance is infinite) go by the first objective, then the next (the objectives are listed in
    the order they matter), then the lower index (the same order at every replay).

    >>> pareto_order([[3, 3], [1, 4], [2, 2], [4, 1]])
    [1, 3, 2, 0]
    """
    order: list[int] = []
    for front in fronts(points):
        distance = _crowding(front, points)
        order += sorted(front, key=lambda i: (-distance[i], tuple(points[i]), i))
    return order


def dominates(a: Sequence[float], b: Sequence[float]) -> bool:
    """Whether ``a`` is at least as good as ``b`` in every objective and better in one (all minimized).

    >>> dominates([1, 2], [1, 3]), dominates([1, 2], [1, 2]), dominates([0, 3], [1, 2])
    (True, False, False)
    """
    return all(x <= y for x, y in zip(a, b, strict=True)) and any(x < y for x, y in zip(a, b, strict=True))
