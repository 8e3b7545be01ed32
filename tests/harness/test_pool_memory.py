"""A pool's cost is stated before it is built, and a pool the machine cannot
hold is refused in one line (the environment, exit 3)."""

from harness.core.pool_memory import available_bytes, estimate, pool_problem


def test_fifty_million_blocks_are_refused_where_memory_lacks():
    e, problem = pool_problem(50_000_000, ["vllm", "impl"], available=8 << 30)
    assert e.bytes == 50_000_000 * 280
    assert problem == ("a pool of 50,000,000 blocks needs about 13.0 GiB and 440 s to build "
                       "on vllm and impl; this machine has 8.0 GiB available")


def test_a_pool_that_fits_is_not_refused():
    assert pool_problem(50_000_000, ["impl"], available=24 << 30)[1] is None
    assert pool_problem(1_000, ["vllm", "impl"], available=1 << 30)[1] is None
    # Where the system does not say, nothing is refused for memory.
    assert pool_problem(10 ** 12, ["impl"], available=None)[1] is None


def test_the_cost_grows_with_blocks_and_backends():
    one, two = estimate(10 ** 6, ["impl"]), estimate(10 ** 6, ["impl", "vllm"])
    assert estimate(2 * 10 ** 6, ["impl"]).bytes == 2 * one.bytes
    assert two.bytes > one.bytes and two.seconds > one.seconds


def test_available_memory_is_read_from_meminfo(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 100 kB\nMemAvailable:    2048 kB\n")
    assert available_bytes(str(meminfo)) == 2048 * 1024
    meminfo.write_text("MemTotal: 100 kB\n")
    assert available_bytes(str(meminfo)) is None
    assert available_bytes(str(tmp_path / "missing")) is None
