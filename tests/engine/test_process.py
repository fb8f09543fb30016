"""Children of the engine die with their parent (a killed worker leaves no verification running)."""
import os
import signal
import subprocess
import sys
import time

PARENT = r"""
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1]])
print(child.pid, flush=True)
time.sleep(60)
"""
CHILD = r"""
import os, time
from worker.engine.children import die_with_parent
assert die_with_parent(os.getppid())
time.sleep(60)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie is dead too
        return stat.read().split(")")[-1].split()[0] != "Z"


def test_a_child_dies_when_its_parent_is_killed():
    parent = subprocess.Popen([sys.executable, "-c", PARENT, CHILD], stdout=subprocess.PIPE, text=True,
                              cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    child_pid = int(parent.stdout.readline())
    time.sleep(0.5)  # let the child make its request
    assert alive(child_pid)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 5
    while alive(child_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child_pid)


def test_numeric_verification_refuses_to_run_for_a_parent_that_is_gone():
    request = '{"parent_pid": 1, "reference": "x", "candidate": "y", "runs": 1, "rtol": 0, "atol": 0, ' \
              '"seed": 0, "shapes": {}}'
    done = subprocess.run([sys.executable, "-m", "worker.engine.numeric"], input=request, capture_output=True, text=True)
    assert done.returncode == 1 and done.stdout == ""
