"""The rule that marks a load case client_limited (kvprobe.stats.client_limit): the client could have
moved its numbers by more than a tenth of a bar."""

from __future__ import annotations

from kvprobe.stats.client_limit import limited

CASE = {"ttft_p99_s": 0.2, "itl_p99_s": 0.03, "e2e_p99_s": 2.0, "itl_p50_s": 0.02, "e2e_p50_s": 1.5}


def test_the_rule_a_tenth_of_the_bar_on_the_p99_the_lag_would_move() -> None:
    # Loop stamps: the lag lands in every chunk's time, so the smallest p99 (ITL 30 ms) counts: 0.3 ms.
    assert limited({"client_stamps": "loop", "client_loop_lag_p99_s": 0.0002}, CASE, 0.10) is None
    why = limited({"client_stamps": "loop", "client_loop_lag_p99_s": 0.0005}, CASE, 0.10)
    assert why and "0.50 ms late" in why and "0.30 ms" in why
    # Kernel stamps: receive times are exact while reads keep up with the tokens (median gap 20 ms)...
    kernel = {"client_stamps": "kernel", "client_loop_lag_p99_s": 0.03, "client_read_lag_p99_s": 0.01,
              "client_loop_lag_mean_s": 0.001}
    assert limited(kernel, CASE, 0.10) is None
    assert limited(kernel | {"client_read_lag_p99_s": 0.05}, CASE, 0.10).startswith(
        "the client read arrived bytes 50.00 ms late")
    # ...and a late loop only sends turns late: 10 ms on average of a 1.5 s request is 0.67% > 0.5%.
    assert "0.7% of a request's median span" in limited(kernel | {"client_loop_lag_mean_s": 0.01}, CASE, 0.10)
    assert "95% of a core" in limited({"client_stamps": "kernel", "client_cpu_share": 0.95}, CASE, 0.10)
