"""Ray nodes in network namespaces of their own, closer to real hosts than ray.cluster_utils:
each node is ``ray start`` in a namespace with its own address on a test bridge (10.213.0.0/24),
its own hostname, its own PID namespace (``ray stop`` there sees only that node's processes, not
other Ray clusters on this machine) and its own /tmp and /dev/shm (a folder of the test
bind-mounted on /tmp, a tmpfs on /dev/shm). The host namespace keeps 10.213.0.1 on the bridge: a
server the test binds there is reachable from every node; no route leaves the bridge.

One such cluster at a time on a machine (a lock file); names left by a run that was killed are
removed by the next. Every command has a timeout; :meth:`NetnsCluster.close` stops Ray in each
namespace, kills what is left there, and removes the namespaces, the bridge and the folders.
Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN), ``ip`` (iproute2) and util-linux: :func:`why_not`
says what is missing."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BRIDGE = "yp-br0"
SUBNET = "10.213.0"  # .1 the host's end of the bridge, .10 + i node i
HOST_IP = f"{SUBNET}.1"
HEAD_PORT = 6379
NAMESPACE_PREFIX = "yp-ns"
VETH_PREFIX = "yp-veth"
LOCK_PATH = "/run/lock/yp-netns-cluster.lock"  # held while a cluster lives: what a killed run left can go
ROOT_PREFIX = "yp-netns-"  # the cluster's folder in the temporary folder: a folder per node (its /tmp), logs
COMMAND_TIMEOUT_S = 30.0  # one ip/nsenter/kill command
LOCK_TIMEOUT_S = 300.0  # another test's namespaced cluster on this machine
NODES_TIMEOUT_S = 150.0  # every node's `ray start` done and registered (2 busy vCPUs: 30-40 s seen)
STOP_TIMEOUT_S = 30.0  # `ray stop --force` in one namespace
GONE_TIMEOUT_S = 10.0  # the processes of a namespace after SIGKILL
POLL_S = 0.5
OBJECT_STORE_BYTES = 100_000_000
FAST_DEATH = {"RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "1000",
              "RAY_health_check_failure_threshold": "3"}  # a killed node is dead in seconds, not a minute

# In the node's new mount, UTS and PID namespaces: its own /tmp, /dev/shm and name; then Ray,
# under a shell that stays PID 1 there and reaps what is orphaned. The folders named before "--"
# (the checkout and the venv, where they lie under /tmp: a fresh clone in `mktemp -d`) are bound
# into the node's /tmp at their own paths first, or its /tmp would hide them.
NODE_SCRIPT = """
root=$1 name=$2
shift 2
while [ "$1" != "--" ]; do
    mkdir -p "$root${1#/tmp}" && mount --bind "$1" "$root${1#/tmp}" || exit 97
    shift
done
shift
mount --rbind "$root" /tmp && mount -t tmpfs -o size=1g yp-shm /dev/shm && hostname "$name" || exit 97
"$@" &
wait
"""


def why_not() -> str | None:
    """Why namespaced nodes cannot be made here, or None."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux, this is {sys.platform}"
    if os.geteuid() != 0:
        return "network namespaces and bridges need root (CAP_NET_ADMIN and CAP_SYS_ADMIN)"
    missing = [tool for tool in ("ip", "unshare", "nsenter", "setpriv") if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not found (apt-get install iproute2 util-linux)"
    if not os.path.isdir(os.path.dirname(LOCK_PATH)):
        return f"{os.path.dirname(LOCK_PATH)} not found (where the cluster's lock file goes)"
    if not ray_command().is_file():
        return f"{ray_command()} not found (pip install -r requirements-ray.txt)"
    probe = f"yp-probe-{os.getpid()}"
    made = _run(["ip", "netns", "add", probe], check=False)
    _run(["ip", "netns", "del", probe], check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    private = _run(["unshare", "--pid", "--fork", "--mount-proc", "--mount", "--uts", "true"], check=False)
    if private.returncode != 0:
        return f"`unshare --pid --mount --uts` failed: {private.stderr.strip()}"
    return None


def folders_under_tmp() -> list[str]:
    """The checkout and the Python environment the nodes run from, where they lie under /tmp."""
    repo = Path(__file__).resolve().parent.parent
    folders = {Path(p).resolve() for p in (repo, sys.prefix, sys.base_prefix)}
    return sorted(str(f) for f in folders if f.is_relative_to("/tmp") and f != Path("/tmp"))


def ray_command() -> Path:
    """The ``ray`` script of the Python running the tests."""
    return Path(sys.executable).parent / "ray"


@dataclasses.dataclass
class Node:
    index: int
    ip: str
    root: Path  # on the host: the node's /tmp
    proc: subprocess.Popen  # unshare, PID 1 of the node's PID namespace its child
    log: Path

    @property
    def namespace(self) -> str:
        return f"{NAMESPACE_PREFIX}{self.index}"

    @property
    def hostname(self) -> str:
        return f"yp-node-{self.index}"

    def init_pid(self) -> int:
        """PID (in this namespace) of the node's PID 1."""
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        if not children:
            raise RuntimeError(f"{self.hostname}: its namespace has no init process (exit code {self.proc.poll()}):\n"
                               f"{self.log.read_text(errors='replace')[-2000:]}")
        return int(children[0])

    def enter(self, wd: str = "/") -> list[str]:
        """The command prefix that runs a command on this node (its network, mounts, PIDs, name) in
        the folder ``wd``."""
        return ["nsenter", "--target", str(self.init_pid()), "--net", "--mount", "--pid", "--uts", f"--wd={wd}"]


class NetnsCluster:
    """The nodes, node 0 the head; made by :func:`netns_cluster`."""

    def __init__(self, root: Path):
        self.root = root
        self.nodes: list[Node] = []

    @property
    def address(self) -> str:
        return f"{SUBNET}.10:{HEAD_PORT}"

    def add_node(self, env: dict[str, str]) -> Node:
        """A namespace on the bridge and ``ray start`` in it (the head first), with ``env``."""
        index = len(self.nodes)
        ip, namespace, veth = f"{SUBNET}.{10 + index}", f"{NAMESPACE_PREFIX}{index}", f"{VETH_PREFIX}{index}"
        _run(["ip", "netns", "add", namespace])
        _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", namespace])
        _run(["ip", "link", "set", veth, "master", BRIDGE, "up"])
        _run(["ip", "-n", namespace, "addr", "add", f"{ip}/24", "dev", "eth0"])
        _run(["ip", "-n", namespace, "link", "set", "eth0", "up"])
        _run(["ip", "-n", namespace, "link", "set", "lo", "up"])
        root = self.root / f"node{index}"
        root.mkdir()
        role = ["--head", "--port", str(HEAD_PORT), "--include-dashboard", "false"] if index == 0 else [
            "--address", self.address]
        ray_start = [str(ray_command()), "start", *role, "--node-ip-address", ip, "--num-cpus", "1",
                     "--object-store-memory", str(OBJECT_STORE_BYTES), "--temp-dir", "/tmp/ray",
                     "--disable-usage-stats", "--resources", json.dumps({f"yp-node-{index}": 1}), "--block"]
        log = self.root / f"node{index}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                ["setpriv", "--pdeathsig", "KILL",  # the node goes if the test's process is killed
                 "ip", "netns", "exec", namespace,
                 "unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--mount", "--uts",
                 "sh", "-c", NODE_SCRIPT, "node", str(root), f"yp-node-{index}", *folders_under_tmp(), "--",
                 *ray_start],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                env={**_node_env(), **FAST_DEATH, **env})
        node = Node(index, ip, root, proc, log)
        self.nodes.append(node)
        return node

    def start(self, count: int, env: dict[str, str], node_env: dict[int, dict[str, str]] | None = None) -> float:
        """``count`` nodes joined into one Ray cluster, node 0 the head; ``env`` for all of them
        and ``node_env[i]`` on top for node ``i``; the seconds it took."""
        started = time.monotonic()
        for index in range(count):
            self.add_node({**env, **(node_env or {}).get(index, {})})
            if index == 0:
                self.wait_for_nodes()  # the others join the head's GCS
        self.wait_for_nodes()
        return time.monotonic() - started

    def alive(self) -> int:
        """Nodes the head's GCS holds alive (asked from this namespace, across the bridge)."""
        from ray._raylet import GcsClient
        from ray.core.generated.gcs_pb2 import GcsNodeInfo
        nodes = GcsClient(address=self.address).get_all_node_info(timeout=COMMAND_TIMEOUT_S)
        return sum(info.state == GcsNodeInfo.ALIVE for info in nodes.values())

    def wait_for_nodes(self, timeout_s: float = NODES_TIMEOUT_S) -> float:
        """Until every node's ``ray start`` is done and the head holds them all alive; the seconds
        it took."""
        started = time.monotonic()
        while not (all(b"Ray runtime started" in node.log.read_bytes() for node in self.nodes)
                   and self.alive() == len(self.nodes)):
            failed = [node for node in self.nodes if node.proc.poll() is not None]
            if failed or time.monotonic() - started > timeout_s:
                node = (failed or self.nodes)[0]
                raise RuntimeError(f"{node.hostname} did not start in {timeout_s:.0f} s (exit code "
                                   f"{node.proc.poll()}):\n{node.log.read_text(errors='replace')[-3000:]}")
            time.sleep(POLL_S)
        return time.monotonic() - started

    def start_on(self, index: int, command: list[str], env: dict[str, str], wd: str = "/",
                 **popen) -> subprocess.Popen:
        """``command`` on node ``index`` (its network, /tmp, PIDs) in the folder ``wd``, in a
        session of its own (``os.killpg`` reaches nsenter and the command)."""
        return subprocess.Popen([*self.nodes[index].enter(wd), *command], env={**_node_env(), **env},
                                stdin=subprocess.DEVNULL, start_new_session=True, **popen)

    def kill(self, index: int) -> list[int]:
        """SIGKILL to every process of node ``index``, Ray's and ours, as a host that loses power."""
        pids = namespace_pids(self.nodes[index].namespace)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pids

    def close(self) -> None:
        """Stop Ray on each node, kill what is left, remove namespaces, bridge and folders; raises
        naming any process that would not go (after removing the rest)."""
        left = {}
        for node in reversed(self.nodes):
            if node.proc.poll() is None:
                with contextlib.suppress(subprocess.TimeoutExpired, RuntimeError, OSError):
                    subprocess.run([*node.enter(), str(ray_command()), "stop", "--force"], stdin=subprocess.DEVNULL,
                                   capture_output=True, timeout=STOP_TIMEOUT_S, env=_node_env())
            self.kill(node.index)
            node.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.proc.wait(timeout=GONE_TIMEOUT_S)
            deadline = time.monotonic() + GONE_TIMEOUT_S
            while namespace_pids(node.namespace) and time.monotonic() < deadline:
                time.sleep(0.1)
            if namespace_pids(node.namespace):
                left[node.namespace] = namespace_pids(node.namespace)
        remove_namespaces()
        shutil.rmtree(self.root, ignore_errors=True)
        if left:
            raise RuntimeError(f"processes left in the nodes' namespaces after SIGKILL: {left}")


@contextlib.contextmanager
def netns_cluster():
    """The bridge, up, and a cluster with no node yet (:meth:`NetnsCluster.start` adds them):
    a server the test binds to :data:`HOST_IP` in the block is reachable from every node.
    Everything goes after the block, whatever happened in it."""
    with _lock():
        remove_namespaces()  # a run that was killed left them, and its folders
        for stale in Path(tempfile.gettempdir()).glob(f"{ROOT_PREFIX}*"):
            shutil.rmtree(stale, ignore_errors=True)
        made = NetnsCluster(Path(tempfile.mkdtemp(prefix=ROOT_PREFIX)))
        try:
            _run(["ip", "link", "add", BRIDGE, "type", "bridge"])
            _run(["ip", "addr", "add", f"{HOST_IP}/24", "dev", BRIDGE])
            _run(["ip", "link", "set", BRIDGE, "up"])
            yield made
        finally:
            made.close()


def remove_namespaces() -> None:
    """Every namespace and the bridge of this scheme, their processes killed first."""
    listed = _run(["ip", "netns", "list"], check=False).stdout.split()
    for namespace in (name for name in listed if name.startswith(NAMESPACE_PREFIX)):
        for pid in namespace_pids(namespace):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _run(["ip", "netns", "del", namespace], check=False)  # its veth goes with it
    if _run(["ip", "link", "show", BRIDGE], check=False).returncode == 0:
        _run(["ip", "link", "del", BRIDGE])


@contextlib.contextmanager
def _lock():
    with open(LOCK_PATH, "w") as held:
        deadline = time.monotonic() + LOCK_TIMEOUT_S
        while True:
            try:
                fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"another namespaced test cluster held {LOCK_PATH} for "
                                       f"{LOCK_TIMEOUT_S:.0f} s") from None
                time.sleep(POLL_S)
        try:
            yield
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)


def namespace_pids(namespace: str) -> list[int]:
    """Processes in the network namespace (host PIDs), whatever their PID namespace."""
    return [int(pid) for pid in _run(["ip", "netns", "pids", namespace], check=False).stdout.split()]


def _node_env() -> dict[str, str]:
    """This environment less what would lead a node's traffic elsewhere (proxies) or share a
    folder with the host (TMPDIR); Ray's usage stats off; Ray's token auth off, as the test's own
    client has it (with the mode unset, ``ray start`` turns it on when a ~/.ray/auth_token
    exists, which any local ``ray.init`` since Ray 2.5x leaves behind)."""
    env = {key: value for key, value in os.environ.items()
           if key.lower() not in ("http_proxy", "https_proxy", "all_proxy", "tmpdir")
           and key != "RAY_AUTH_TOKEN"}
    return {**env, "PATH": f"{ray_command().parent}{os.pathsep}{env.get('PATH', '')}",
            "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}


def _run(command: list[str], check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=COMMAND_TIMEOUT_S)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: exit {done.returncode}: {done.stderr.strip()}")
    return done
