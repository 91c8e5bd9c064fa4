"""The worker's Clock: the CPU of a busy section counts every thread of the process, as torch's
intra-op threads work on the frame beside the thread that called the forward."""

import threading
import time

from process.clock import Clock

HELPER_CPU_S = 0.2


def burn_own_cpu(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_a_busy_section_counts_the_cpu_of_a_second_thread():
    """The calling thread only waits (join) while a second thread spends HELPER_CPU_S of its own
    CPU: the section's CPU holds it, however loaded the machine (CPU time, not wall time)."""
    clock = Clock()
    with clock.busy() as spent:
        helper = threading.Thread(target=burn_own_cpu, args=(HELPER_CPU_S,))
        helper.start()
        helper.join()
    wall_s, cpu_s = spent
    assert cpu_s >= HELPER_CPU_S * 0.99 and clock.busy_cpu_s == cpu_s
    clock.add_frames(wall_s, cpu_s, frames=2)
    assert clock.frame_cpu_ms.to_dict()["count"] == 2
