"""The block-pool picture renders, at the size it says, with the divergence drawn."""

from PIL import Image

from harness.backends.base import POOL_FREE, POOL_FREE_CACHED, POOL_NULL, POOL_SHARED
from harness.pool_picture import DIVERGENCE_RGB, draw_pool


def _timeline(n_events=40, n_blocks=12):
    out = []
    for t in range(n_events):
        codes = [POOL_NULL] + [POOL_FREE] * (n_blocks - 1)
        for b in range(1, min(n_blocks, 1 + t // 3)):
            codes[b] = b % 3  # three requests
        codes[-1] = POOL_FREE_CACHED
        codes[-2] = POOL_SHARED
        out.append((10 + t, "allocate", codes))
    return out


def test_picture_size_and_divergence_line(tmp_path):
    path = tmp_path / "pool.png"
    pic = draw_pool(_timeline(), 3, str(path), divergence_index=30, title="t")
    img = Image.open(path).convert("RGB")
    assert img.size == (pic.width, pic.height)
    assert pic.width >= 600 and pic.height >= 300
    red = tuple(round(c * 255) for c in DIVERGENCE_RGB)

    def is_red(px):
        return all(abs(a - b) < 40 for a, b in zip(px, red))

    # The divergence line: a tall run of red pixels at the reported column ...
    column = [img.getpixel((pic.divergence_x, y)) for y in range(img.height)]
    assert sum(map(is_red, column)) > img.height // 4
    # ... and nowhere far from it.
    far = pic.divergence_x // 2
    assert sum(is_red(img.getpixel((far, y))) for y in range(img.height)) == 0


def test_no_divergence_no_line(tmp_path):
    pic = draw_pool(_timeline(5, 4), 3, str(tmp_path / "p.png"))
    assert pic.divergence_x is None


def test_long_timelines_are_sampled_but_keep_the_divergence(tmp_path):
    timeline = _timeline(5000, 6)
    pic = draw_pool(timeline, 3, str(tmp_path / "p.png"), divergence_index=4321)
    assert pic.divergence_x is not None
