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


TRACE = """\
header:
  format: kvconform-trace/1
  vllm_version: 0.32.0
  source: hand
  cache: {num_blocks: 50000000, groups: [{block_size: 16}]}
events:
- {op: add_request, req: a, prompt: [1, 2, 3]}
"""


def test_diff_refuses_a_pool_the_machine_cannot_hold_before_building_it(tmp_path, capsys,
                                                                         monkeypatch):
    """50,000,000 blocks, which the schema allows, on a machine with 8 GiB
    available: one line naming the field, exit 3, and no backend built."""
    import harness.core.pool_memory as pool_memory
    from harness.backends.impl_backend import ImplBackend
    from harness.backends.vllm_backend import VllmBackend
    from harness.cli.main import main

    def never(*a, **k):
        raise AssertionError("a backend was built")

    monkeypatch.setattr(pool_memory, "available_bytes", lambda: 8 << 30)
    monkeypatch.setattr(ImplBackend, "__init__", never)
    monkeypatch.setattr(VllmBackend, "__init__", never)
    path = tmp_path / "big.yaml"
    path.write_text(TRACE)
    assert main(["diff", str(path)]) == 3
    err = capsys.readouterr().err
    assert "Traceback" not in err and "a backend was built" not in err
    assert (f"{path}:1: cache.num_blocks: a pool of 50,000,000 blocks needs about 13.0 GiB "
            "and 440 s to build on vllm and impl; this machine has 8.0 GiB available") in err


def test_replay_alone_needs_impl_s_share_only(tmp_path, capsys, monkeypatch):
    import harness.core.pool_memory as pool_memory
    from harness.cli.main import main

    path = tmp_path / "big.yaml"
    path.write_text(TRACE)
    monkeypatch.setattr(pool_memory, "available_bytes", lambda: 4 << 30)
    assert main(["replay", str(path)]) == 3
    line = next(x for x in capsys.readouterr().err.splitlines() if "cache.num_blocks" in x)
    assert line == (f"{path}:1: cache.num_blocks: a pool of 50,000,000 blocks needs about "
                    "6.5 GiB and 40 s to build on impl; this machine has 4.0 GiB available")


def test_a_large_pool_that_fits_is_announced_before_it_is_built(tmp_path, capsys):
    from harness.cli.main import main

    path = tmp_path / "m.yaml"
    path.write_text(TRACE.replace("50000000", "1000000"))
    assert main(["replay", str(path)]) == 0
    err = capsys.readouterr().err
    assert (f"{path}: a pool of 1,000,000 blocks needs about 0.1 GiB and 1 s to build "
            "on impl") in err
