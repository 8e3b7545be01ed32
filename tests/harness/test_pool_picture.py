"""The block-pool picture: it fits a page, its x axis is the scheduler step, it has
the hit-rate and usage panels, the divergence line runs through all of them at the
step it happened in, and requests get colours of their own."""

from PIL import Image

from harness.backends.base import POOL_FREE, POOL_FREE_CACHED, POOL_NULL, POOL_SHARED
from harness.core.traffic import PoolSample, StepStats, Traffic
from harness.report.pool_picture import DIVERGENCE_RGB, WIDTH_PX, draw_pool, request_colour


def _traffic(n_steps=40, n_blocks=12, requests=3, unused=0):
    t = Traffic(pool_samples=True, has_steps=True)
    for s in range(n_steps):
        codes = [POOL_NULL] + [POOL_FREE] * (n_blocks - 1)
        for b in range(1, min(n_blocks - unused, 1 + s // 3)):
            codes[b] = b % requests
        codes[n_blocks - unused - 1] = POOL_FREE_CACHED
        codes[n_blocks - unused - 2] = POOL_SHARED
        t.samples.append(PoolSample(3 * s, 10 + 3 * s, s, codes))
        t.steps.append(StepStats(s, queries=10, hits=s % 10, lookups=1, usage=s / n_steps))
    t.request_index = {f"r{i}": i for i in range(requests)}
    return t


def _is_red(px):
    red = tuple(round(c * 255) for c in DIVERGENCE_RGB)
    return all(abs(a - b) < 40 for a, b in zip(px, red))


def test_the_picture_fits_a_page_and_marks_the_divergence_in_every_panel(tmp_path):
    path = tmp_path / "pool.png"
    pic = draw_pool(_traffic(), str(path), divergence=True, title="t")
    img = Image.open(path).convert("RGB")
    assert img.size == (pic.width, pic.height)
    assert pic.width <= WIDTH_PX and pic.height >= 500
    # The divergence line: red through most of the height (three panels) ...
    column = [img.getpixel((pic.divergence_x, y)) for y in range(img.height)]
    assert sum(map(_is_red, column)) > img.height // 2
    # ... at the last step, and nowhere far from it.
    assert pic.divergence_x > pic.width * 0.8
    far = pic.divergence_x // 2
    assert sum(_is_red(img.getpixel((far, y))) for y in range(img.height)) == 0


def test_no_divergence_no_line(tmp_path):
    pic = draw_pool(_traffic(5, 4), str(tmp_path / "p.png"))
    assert pic.divergence_x is None


def test_rows_stop_at_the_highest_block_ever_used(tmp_path):
    """A server's pool of thousands of blocks, of which a few are used, is drawn
    as those few rows, not as a white page."""
    small = draw_pool(_traffic(20, 12), str(tmp_path / "a.png"))
    big = draw_pool(_traffic(20, 5012, unused=5000), str(tmp_path / "b.png"))
    a = Image.open(small.path).convert("RGB")
    b = Image.open(big.path).convert("RGB")
    assert a.size == b.size
    # The same picture: at most antialiasing differences.
    diff = sum(1 for x in range(0, a.width, 7) for y in range(0, a.height, 7)
               if a.getpixel((x, y)) != b.getpixel((x, y)))
    assert diff < 0.01 * (a.width // 7) * (a.height // 7)


def test_fifty_requests_get_fifty_colours():
    colours = {tuple(round(c, 3) for c in request_colour(k)) for k in range(50)}
    assert len(colours) == 50
    # Neighbours (requests that come one after the other) differ clearly.
    for k in range(49):
        a, b = request_colour(k), request_colour(k + 1)
        assert sum(abs(x - y) for x, y in zip(a, b)) > 0.2


def _near(img, x, rgb, tol=60):
    """Whether a pixel of colour `rgb` lies in column x (or one beside it),
    below the pool panel (whose request colours may come near any colour)."""
    want = tuple(round(c * 255) for c in rgb)
    return any(all(abs(a - b) < tol for a, b in zip(img.getpixel((c, y)), want))
               for c in (x - 1, x, x + 1) for y in range(int(img.height * 0.6), img.height))


def test_preemptions_and_evictions_are_marked_on_the_usage_panel(tmp_path):
    from harness.report.pool_picture import EVICTION_RGB, PREEMPTION_RGB

    t = _traffic(40, 12)
    t.steps[10].preemptions, t.steps[30].preemptions = 2, 1
    t.steps[20].evicted = 5
    pic = draw_pool(t, str(tmp_path / "p.png"))
    img = Image.open(pic.path).convert("RGB")
    assert len(pic.preemption_x) == 2 and len(pic.eviction_x) == 1
    assert pic.preemption_x[0] < pic.eviction_x[0] < pic.preemption_x[1]
    for x in pic.preemption_x:
        assert _near(img, x, PREEMPTION_RGB)
    assert _near(img, pic.eviction_x[0], EVICTION_RGB)
    # Negative control: a run without either has no such marks.
    quiet = draw_pool(_traffic(40, 12), str(tmp_path / "q.png"))
    q = Image.open(quiet.path).convert("RGB")
    assert quiet.preemption_x == [] and quiet.eviction_x == []
    assert not _near(q, pic.preemption_x[0], PREEMPTION_RGB)


def test_the_golden_preemption_trace_shows_its_preemptions(tmp_path):
    """`kvconform report` on the tight-memory trace: what `stats` counts (its
    preemptions and evicted blocks), the picture marks."""
    from harness.sources.replay import check_trace

    o = check_trace("traces/golden/v0.32/tight-memory-preemption.jsonl", ["impl"],
                    observe=True, observe_pool=True)
    t = o.traffic
    assert t.preemptions > 0 and t.evicted > 0
    pic = draw_pool(t, str(tmp_path / "g.png"))
    assert len(pic.preemption_x) == sum(1 for s in t.steps if s.preemptions)
    assert len(pic.eviction_x) == sum(1 for s in t.steps if s.evicted)
