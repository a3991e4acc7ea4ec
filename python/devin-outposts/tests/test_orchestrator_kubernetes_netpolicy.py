"""The ``kubernetes`` driver's NetworkPolicy: rendered offline; made, owned and removed in a fake API server.

A session whose ``spec.network_policy`` is enabled gets a NetworkPolicy beside its Pod and Secret
(drivers/kubernetes/network_policy.py). The driver talks to the fake (tests/k8s_fake.py) through its real
client, and every assertion reads what the fake holds, as in test_orchestrator_kubernetes.py. The ranges are
checked by what they let through: an address is reachable on a port when a rule's peer covers it (in a
``cidr`` and in none of its ``except``), as the NetworkPolicy API defines it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
from collections.abc import Coroutine, Iterator, Mapping
from pathlib import Path
from typing import Any, Optional, TypeVar

import pytest

pytest.importorskip("lightkube", reason="the kubernetes extra (lightkube) is not installed")

from k8s_fake import SCHEMA_VERSIONS, FakeKube, no_network, run_fake_kube
from orchestrator_fakes import Running

from devin_outposts.api.models import Outpost
from devin_outposts.core.netpolicy.policy import NOT_PUBLIC, Policy, is_public
from devin_outposts.orchestrator.drivers import driver_class
from devin_outposts.orchestrator.drivers.base import (
    LABEL_MANAGED_BY,
    LABEL_SESSION,
    MANAGED_BY,
    DriverContext,
    DriverError,
    SessionSpec,
    WorkerLaunch,
)
from devin_outposts.orchestrator.drivers.kubernetes import KubernetesDriver, render_session_manifests
from devin_outposts.orchestrator.drivers.kubernetes.manifests import secret_name
from devin_outposts.orchestrator.drivers.kubernetes.network_policy import (
    DEFAULT_DNS_PEER,
    render_network_policy,
)
from devin_outposts.orchestrator.options import OrchestratorConfig
from devin_outposts.orchestrator.runner import Orchestrator
from devin_outposts_sim.testing import SimHandle

from worker_fakes import wait_for

T = TypeVar("T")
NS = "outposts"
IMAGE = "registry.example/devin-outposts-session:1"
GATEWAY = "wss://gateway.example/x"
POLICY = {
    "enabled": True,
    "allow": [
        {"hostname": "github.com"},
        {"hostname": "*.pypi.org"},
        {"ipv4": "10.20.0.0/16"},
        {"ipv6": "fd00:1::1"},
        {"ipv4": "169.254.169.254"},
    ],
}
METADATA = ipaddress.ip_address("169.254.169.254")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


@pytest.fixture
def fake() -> Iterator[FakeKube]:
    with run_fake_kube() as server:
        yield server


def make_driver(fake: FakeKube, tmp_path: Path, **options: Any) -> KubernetesDriver:
    config = fake.kubeconfig(tmp_path / "kubeconfig")
    context = DriverContext(state_dir=tmp_path / "state", worker_command=("devin-outposts",))
    driver = driver_class("kubernetes").from_options(
        context, {"kubeconfig": str(config), "image": IMAGE, **options}
    )
    assert isinstance(driver, KubernetesDriver)
    return driver


def spec(session_id: str = "devin-abc123", acceptor: str = "orch-1") -> SessionSpec:
    return SessionSpec(session_id=session_id, outpost_id="outpost_env-1", acceptor_id=acceptor)


def launch(
    session_id: str = "devin-abc123",
    policy: Optional[Mapping[str, Any]] = None,
    gateway: str = GATEWAY,
) -> WorkerLaunch:
    return WorkerLaunch(
        session_id=session_id, connect_token="ct_x", gateway_url=gateway, network_policy=policy
    )


def reachable(network_policy: Mapping[str, Any], address: str, port: int, protocol: str = "TCP") -> bool:
    """Whether the NetworkPolicy lets its Pod send to ``address:port`` over ``protocol`` (ipBlock peers
    only: a selector peer names Pods, not addresses)."""
    ip = ipaddress.ip_address(address)
    for rule in network_policy["spec"]["egress"]:
        ports = rule.get("ports") or [{}]
        if not any(p.get("protocol", "TCP") == protocol and p.get("port", port) == port for p in ports):
            continue
        for peer in rule["to"]:
            block = peer.get("ipBlock")
            if block is None:
                continue
            cidr = ipaddress.ip_network(block["cidr"])
            excepted = (ipaddress.ip_network(net) for net in block.get("except") or [])
            if ip.version == cidr.version and ip in cidr and not any(ip in net for net in excepted):
                return True
    return False


def fence_of(objects: list[dict[str, Any]]) -> dict[str, Any]:
    [fence] = [o for o in objects if o["kind"] == "NetworkPolicy"]
    return fence


# -- the rendered NetworkPolicy ----------------------------------------------------------------------------


def test_an_enabled_policy_renders_a_fence_for_its_pod_only() -> None:
    objects = render_session_manifests(spec(), launch(policy=POLICY), options={"image": IMAGE})
    assert [o["kind"] for o in objects] == ["Secret", "NetworkPolicy", "Pod"]
    fence, pod = objects[1], objects[2]
    assert fence["apiVersion"] == "networking.k8s.io/v1"
    assert fence["metadata"]["name"].startswith("outpost-egress-devin-abc123-")
    assert fence["metadata"]["labels"] == pod["metadata"]["labels"]
    assert fence["metadata"]["annotations"] == pod["metadata"]["annotations"]
    selector = fence["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= pod["metadata"]["labels"].items()
    other = render_session_manifests(spec("devin-other"), launch("devin-other"), options={"image": IMAGE})
    assert not selector.items() <= other[-1]["metadata"]["labels"].items()
    assert fence["spec"]["policyTypes"] == ["Egress"]
    dns = fence["spec"]["egress"][0]
    assert dns == {
        "to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
        "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
    }


@pytest.mark.parametrize("policy", [None, {"enabled": False, "allow": [{"ipv4": "10.0.0.0/8"}]}, {}])
def test_no_fence_without_an_enabled_policy(policy: Optional[dict[str, Any]]) -> None:
    objects = render_session_manifests(spec(), launch(policy=policy), options={"image": IMAGE})
    assert [o["kind"] for o in objects] == ["Secret", "Pod"]


def test_the_public_ranges_are_split_by_family_and_except_lies_within_its_cidr() -> None:
    fence = fence_of(render_session_manifests(spec(), launch(policy=POLICY), options={"image": IMAGE}))
    blocks = [peer["ipBlock"] for rule in fence["spec"]["egress"] for peer in rule["to"] if "ipBlock" in peer]
    for block in blocks:
        cidr = ipaddress.ip_network(block["cidr"])  # strict: no host bits, as the API requires
        for text in block.get("except") or []:
            excepted = ipaddress.ip_network(text)
            assert excepted.version == cidr.version and excepted.subnet_of(cidr)  # type: ignore[arg-type]
            assert excepted != cidr
    public = {block["cidr"]: block["except"] for block in blocks if "except" in block}
    assert set(public) == {"0.0.0.0/0", "::/0"}
    # The rebinding guard's own list, whole, on its family's side.
    for network in NOT_PUBLIC:
        assert str(network) in public["0.0.0.0/0" if network.version == 4 else "::/0"]


@pytest.mark.parametrize(
    ("address", "port", "protocol", "expected"),
    [
        ("140.82.112.3", 443, "TCP", True),  # a public address: hostname rules are the proxy's to judge
        ("2606:4700::1111", 22, "TCP", True),
        ("140.82.112.3", 443, "UDP", False),  # the sandbox drops UDP: so does the fence
        ("10.20.3.4", 5432, "TCP", True),  # ipv4 10.20.0.0/16
        ("10.21.0.1", 5432, "TCP", False),  # the cluster's other private ranges: not past the fence
        ("192.168.1.1", 80, "TCP", False),
        ("127.0.0.1", 80, "TCP", False),
        ("fd00:1::1", 8080, "TCP", True),  # ipv6 fd00:1::1 (a bare address is /128)
        ("fd00:1::2", 8080, "TCP", False),
        ("fe80::1", 80, "TCP", False),
        ("64:ff9b::a9fe:a9fe", 80, "TCP", False),  # the metadata address through NAT64
        ("2002:c0a8:101::1", 80, "TCP", False),  # 192.168.1.1 as 6to4
    ],
)
def test_what_the_fence_lets_through(address: str, port: int, protocol: str, expected: bool) -> None:
    fence = fence_of(render_session_manifests(spec(), launch(policy=POLICY), options={"image": IMAGE}))
    assert reachable(fence, address, port, protocol) is expected
    # The same verdict as the policy's own reading, for an address a name resolved to.
    if protocol == "TCP":
        decision = Policy.from_spec(POLICY).check_address("github.com", port, address)
        assert decision.allowed is expected


def test_the_metadata_address_is_fenced_off_unless_an_ip_rule_allows_it() -> None:
    hostnames_only = {"enabled": True, "allow": [{"hostname": "*"}]}
    fence = fence_of(
        render_session_manifests(spec(), launch(policy=hostnames_only), options={"image": IMAGE})
    )
    assert not reachable(fence, str(METADATA), 80)
    assert not is_public(METADATA)
    allowed = fence_of(render_session_manifests(spec(), launch(policy=POLICY), options={"image": IMAGE}))
    assert reachable(allowed, str(METADATA), 80)
    [ip_rule] = [r for r in allowed["spec"]["egress"] if {"ipBlock": {"cidr": "10.20.0.0/16"}} in r["to"]]
    assert ip_rule == {
        "to": [
            {"ipBlock": {"cidr": "10.20.0.0/16"}},
            {"ipBlock": {"cidr": "fd00:1::1/128"}},
            {"ipBlock": {"cidr": "169.254.169.254/32"}},
        ],
        "ports": [{"protocol": "TCP"}],
    }


def test_a_gateway_at_an_address_is_allowed_on_its_port_whatever_the_address() -> None:
    policy = {"enabled": True, "allow": []}
    fence = fence_of(
        render_session_manifests(
            spec(), launch(policy=policy, gateway="wss://10.9.8.7:8443/gw"), options={"image": IMAGE}
        )
    )
    assert reachable(fence, "10.9.8.7", 8443)
    assert not reachable(fence, "10.9.8.7", 22)
    six = fence_of(
        render_session_manifests(
            spec(), launch(policy=policy, gateway="wss://[fd00::7]/gw"), options={"image": IMAGE}
        )
    )
    assert reachable(six, "fd00::7", 443) and not reachable(six, "fd00::8", 443)


def test_a_policy_that_is_not_a_policy_still_gets_a_fence() -> None:
    # The worker refuses such a session; the Pod is fenced meanwhile (no ip rule can be read from it).
    fence = render_network_policy(NS, spec(), launch(policy={"enabled": True, "allow": "everything"}))
    assert fence is not None
    assert not reachable(fence, "10.0.0.1", 80) and reachable(fence, "140.82.112.3", 443)


def test_the_dns_peer_and_extra_cidrs_are_options() -> None:
    options = {
        "image": IMAGE,
        "network_policy_dns": {"ipBlock": {"cidr": "169.254.20.10/32"}},
        "network_policy_cidrs": "10.96.0.0/12, fd00:2::/64",
    }
    fence = fence_of(render_session_manifests(spec(), launch(policy=POLICY), options=options))
    assert fence["spec"]["egress"][0]["to"] == [{"ipBlock": {"cidr": "169.254.20.10/32"}}]
    assert reachable(fence, "169.254.20.10", 53, "UDP") and not reachable(fence, "169.254.20.11", 53, "UDP")
    assert reachable(fence, "10.100.0.1", 443) and reachable(fence, "fd00:2::5", 443)
    # The default peer is not shared with (or changed through) what was rendered.
    fence["spec"]["egress"][0]["to"][0]["ipBlock"]["cidr"] = "x"
    default = fence_of(render_session_manifests(spec(), launch(policy=POLICY), options={"image": IMAGE}))
    assert default["spec"]["egress"][0]["to"] == [DEFAULT_DNS_PEER]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"network_policy_dns": {"podSelectr": {}}}, "network_policy_dns: unknown key podSelectr"),
        ({"network_policy_dns": {}}, "network_policy_dns: is empty"),
        ({"network_policy_dns": {"ipBlock": "10.0.0.1/32"}}, "network_policy_dns.ipBlock must be a mapping"),
        ({"network_policy_cidrs": ["10.0.0.0/8", "example.com"]}, "has 'example.com', which is not"),
    ],
)
def test_bad_network_policy_options_are_refused(
    tmp_path: Path, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(DriverError) as caught:
        driver_class("kubernetes").from_options(
            DriverContext(state_dir=tmp_path), {"image": IMAGE, **options}
        )
    assert message in str(caught.value) and "\n" not in str(caught.value)


# -- in the (fake) cluster ----------------------------------------------------------------------------------


def test_a_policy_session_gets_its_fence_owned_by_its_pod_and_teardown_removes_it(
    fake: FakeKube, tmp_path: Path
) -> None:
    driver = make_driver(fake, tmp_path)
    fence_uids: list[str] = []

    async def scenario() -> list[str]:
        machine = await driver.provision(spec())
        for dummy in range(2):  # the second start replaces the worker: a new Pod, a new fence
            await driver.start(machine, launch(policy=POLICY))
            [pod] = fake.objects("Pod", NS)
            [fence] = fake.objects("NetworkPolicy", NS)
            fence_uids.append(fence["metadata"]["uid"])
            assert fence["metadata"]["ownerReferences"] == [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": pod["metadata"]["name"],
                    "uid": pod["metadata"]["uid"],
                }
            ]
            # It selects exactly this Pod, and reached the cluster whole (an empty namespaceSelector, which
            # means every namespace, is not dropped on the way).
            selector = fence["spec"]["podSelector"]["matchLabels"]
            assert selector == {
                LABEL_MANAGED_BY: MANAGED_BY,
                LABEL_SESSION: pod["metadata"]["labels"][LABEL_SESSION],
            }
            assert fence["spec"]["egress"][0]["to"] == [DEFAULT_DNS_PEER]
            assert reachable(fence, "10.20.0.1", 443) and not reachable(fence, "10.30.0.1", 443)
        owned = await driver.list_owned("orch-1", "outpost_env-1")  # the fence is no machine
        await driver.teardown(machine)
        await driver.teardown(machine)  # gone already: no error
        await driver.aclose()
        return [m.session_id for m in owned]

    assert run(scenario()) == ["devin-abc123"]
    assert fence_uids[0] != fence_uids[1]  # recreated, not updated: the collector deletes by uid
    assert fake.objects("NetworkPolicy", NS) == [] and fake.objects("Pod", NS) == []


def test_a_session_without_a_policy_gets_no_fence_and_loses_a_stale_one(
    fake: FakeKube, tmp_path: Path
) -> None:
    driver = make_driver(fake, tmp_path)
    stale = render_network_policy(NS, spec("devin-2"), launch("devin-2", policy=POLICY))
    assert stale is not None
    fake.put(stale)

    async def scenario() -> None:
        await driver.start(await driver.provision(spec("devin-1")), launch("devin-1"))
        await driver.start(
            await driver.provision(spec("devin-2")), launch("devin-2", policy={"enabled": False, "allow": []})
        )
        await driver.aclose()

    run(scenario())
    assert len(fake.objects("Pod", NS)) == 2
    assert fake.objects("NetworkPolicy", NS) == []


def uids(fake: FakeKube) -> dict[str, str]:
    """The uid of each Pod, Secret and NetworkPolicy in the namespace, by kind and name."""
    return {
        f"{kind} {obj['metadata']['name']}": obj["metadata"]["uid"]
        for kind in ("Pod", "Secret", "NetworkPolicy")
        for obj in fake.objects(kind, NS)
    }


def deletes(fake: FakeKube, since: int) -> dict[str, int]:
    """Deletes the fake answered since request number ``since``, by resource."""
    return {
        resource: fake.count("delete", resource, since) for resource in ("pods", "secrets", "networkpolicies")
    }


@pytest.mark.parametrize("policy", [POLICY, None], ids=["fenced", "unfenced"])
def test_a_first_start_deletes_nothing_and_a_second_start_still_replaces_everything(
    fake: FakeKube, tmp_path: Path, policy: Optional[dict[str, Any]]
) -> None:
    """On a fresh machine every delete before a create would be a 404: its first start sends none (without a
    policy it reads whether a NetworkPolicy of the session's name is there instead). Starting the same
    machine again (a restart) still makes the Pod, the Secret and the NetworkPolicy anew, with new uids:
    the garbage collector may be deleting the old ones for the old Pod, by uid."""
    driver = make_driver(fake, tmp_path)

    async def scenario() -> tuple[dict[str, int], dict[str, str], dict[str, int], dict[str, str]]:
        machine = await driver.provision(spec())
        began = len(fake.requests)
        await driver.start(machine, launch(policy=policy))
        first = (deletes(fake, began), uids(fake))
        assert fake.count("get", "networkpolicies", began) == (0 if policy else 1)
        began = len(fake.requests)
        await driver.start(machine, launch(policy=policy))
        await driver.aclose()
        return (*first, deletes(fake, began), uids(fake))

    first_deletes, first_uids, second_deletes, second_uids = run(scenario())
    assert first_deletes == {"pods": 0, "secrets": 0, "networkpolicies": 0}
    assert second_deletes == {"pods": 1, "secrets": 1, "networkpolicies": 1}
    kinds = ["Pod", "Secret", "NetworkPolicy"] if policy else ["Pod", "Secret"]
    assert sorted(name.split()[0] for name in first_uids) == sorted(kinds)
    assert first_uids.keys() == second_uids.keys()
    assert all(first_uids[name] != second_uids[name] for name in first_uids), (first_uids, second_uids)
    [pod] = fake.objects("Pod", NS)
    owned = [obj for kind in kinds[1:] for obj in fake.objects(kind, NS)]
    assert all(o["metadata"]["ownerReferences"][0]["uid"] == pod["metadata"]["uid"] for o in owned)


def test_a_first_start_replaces_what_an_earlier_start_left(fake: FakeKube, tmp_path: Path) -> None:
    """A start cut short (its claim expired) leaves a Secret and a NetworkPolicy and maybe no Pod: the next
    first start of that session finds the Secret there and replaces everything as a restart does. A Pod
    made between provision and start (another orchestrator racing this one) is replaced too."""
    driver = make_driver(fake, tmp_path)
    left = {
        obj["kind"]: fake.put(obj)["metadata"]["uid"]
        for obj in render_session_manifests(
            spec(), launch(policy={"enabled": True, "allow": []}), namespace=NS, options={"image": IMAGE}
        )
        if obj["kind"] in ("Secret", "NetworkPolicy")
    }
    raced = next(
        obj
        for obj in render_session_manifests(
            spec("devin-2"), launch("devin-2"), namespace=NS, options={"image": IMAGE}
        )
        if obj["kind"] == "Pod"
    )

    async def scenario() -> None:
        await driver.start(await driver.provision(spec()), launch(policy=POLICY))
        machine = await driver.provision(spec("devin-2"))
        left["Pod"] = fake.put(raced)["metadata"]["uid"]
        await driver.start(machine, launch("devin-2"))
        await driver.aclose()

    run(scenario())
    body = render_network_policy(NS, spec(), launch(policy=POLICY))
    assert body is not None
    fence = fake.get("NetworkPolicy", NS, body["metadata"]["name"])
    assert (
        fence is not None
        and fence["spec"] == body["spec"]
        and fence["metadata"]["uid"] != left["NetworkPolicy"]
    )
    secret = fake.get("Secret", NS, secret_name(spec().session_id))
    assert secret is not None and secret["metadata"]["uid"] != left["Secret"]
    pods = {p["metadata"]["name"]: p["metadata"]["uid"] for p in fake.objects("Pod", NS)}
    assert len(pods) == 2 and pods[raced["metadata"]["name"]] != left["Pod"]


def test_a_fence_already_there_is_read_and_made_this_sessions(fake: FakeKube, tmp_path: Path) -> None:
    driver = make_driver(fake, tmp_path)
    body = render_network_policy(NS, spec(), launch(policy=POLICY))
    assert body is not None
    outdated = json.loads(json.dumps(body))
    outdated["spec"]["egress"] = [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}]
    uid = fake.put(outdated)["metadata"]["uid"]
    theirs = render_network_policy(NS, spec("devin-theirs"), launch("devin-theirs", policy=POLICY))
    assert theirs is not None
    theirs["metadata"]["name"] = body["metadata"]["name"].replace("abc123", "abc124")
    fake.put(theirs)
    mine = json.loads(json.dumps(body))
    mine["metadata"]["name"] = theirs["metadata"]["name"]

    async def scenario() -> None:
        # What start does after its delete, when another orchestrator made the object meanwhile (409).
        await driver._create_network_policy(spec(), body)
        with pytest.raises(DriverError, match="already belongs to session 'devin-theirs'"):
            await driver._create_network_policy(spec(), mine)
        await driver.aclose()

    run(scenario())
    current = fake.get("NetworkPolicy", NS, body["metadata"]["name"])
    assert current is not None and current["metadata"]["uid"] == uid
    assert current["spec"] == body["spec"]
    untouched = fake.get("NetworkPolicy", NS, theirs["metadata"]["name"])
    assert untouched is not None and untouched["spec"] == theirs["spec"]


def test_sweep_orphans_removes_the_fences_of_sessions_not_live(fake: FakeKube, tmp_path: Path) -> None:
    driver = make_driver(fake, tmp_path)

    async def scenario() -> int:
        for sid in ("devin-live", "devin-gone"):
            await driver.start(await driver.provision(spec(sid)), launch(sid, policy=POLICY))
        for pod in fake.objects("Pod", NS):  # deleted by hand; no garbage collector in the fake
            if "gone" in pod["metadata"]["name"]:
                del fake.store[("Pod", NS, pod["metadata"]["name"])]
        removed = await driver.sweep_orphans("orch-1", "outpost_env-1", {"devin-live"})
        await driver.aclose()
        return removed

    assert run(scenario()) == 2  # devin-gone's Secret and NetworkPolicy
    [fence] = fake.objects("NetworkPolicy", NS)
    assert "devin-live" in fence["metadata"]["name"]


def test_a_pod_that_cannot_confine_gives_the_session_back_at_once(
    sim: SimHandle, outpost: Outpost, fake: FakeKube, tmp_path: Path
) -> None:
    """The orchestrator's loop: a policy session's Pod gets its NetworkPolicy; its worker cannot confine (a
    Pod whose seccomp profile forbids user namespaces) and exits 9, which the kubelet restarts in place; the
    driver reports that exit, and the orchestrator releases the claim at once, without waiting for its
    restart limit, and removes the Pod, the Secret and the NetworkPolicy."""
    config = OrchestratorConfig(
        outpost=outpost.name, driver="kubernetes", max_concurrent=1, state_dir=tmp_path / "orch",
        acceptor_id="k8s-netpolicy", api_url=sim.url, token=sim.create_token("orchestrator"),
        status_interval=0.05, poll_interval=0.2, confirm_interval=0.05, confirm_reads=2, gc_interval=0.3,
        backoff_max=1.0, restart_limit=5,
        driver_options={"kubeconfig": str(fake.kubeconfig(tmp_path / "kubeconfig", namespace=NS)),
                        "namespace": NS, "image": IMAGE, "leader_election": False},
    )  # fmt: skip
    orchestrator = Running(Orchestrator(config))
    try:
        sid = sim.admin.enqueue(outpost.outpost_id, network_policy=POLICY).session_id
        [fence] = wait_for(lambda: fake.objects("NetworkPolicy", NS), timeout=20, what="the NetworkPolicy")
        [pod] = wait_for(lambda: fake.objects("Pod", NS), timeout=20, what="the session's Pod")
        assert fence["metadata"]["annotations"]["outposts.devin.ai/session-id"] == sid
        assert fence["spec"]["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
        assert reachable(fence, "10.20.0.1", 443) and not reachable(fence, "10.30.0.1", 443)
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        handed = json.loads(env["DEVIN_WORKER_SESSION_NETWORK_POLICY"])  # as the API model dumps it
        assert Policy.from_spec(handed) == Policy.from_spec(POLICY)
        # The worker runs (its probe takes a moment), then exits 9, and the kubelet restarts it in place.
        running = {"name": "devin-worker", "restartCount": 0, "state": {"running": {}}}
        fake.set_pod_status(NS, pod["metadata"]["name"], {"phase": "Running", "containerStatuses": [running]})
        sessions = orchestrator.orchestrator.sessions
        wait_for(lambda: sessions and sessions[0].running_now, timeout=20, what="the worker seen running")
        fake.set_pod_status(
            NS,
            pod["metadata"]["name"],
            {
                "phase": "Running",
                "containerStatuses": [
                    {
                        "name": "devin-worker",
                        "restartCount": 1,
                        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                        "lastState": {"terminated": {"exitCode": 9, "reason": "Error"}},
                    }
                ],
            },
        )
        wait_for(
            lambda: any(c["action"] == "release" for c in sim.admin.claims(session_id=sid)),
            timeout=30,
            what="the claim to be released",
        )
        wait_for(
            lambda: not fake.objects("Pod", NS) and not fake.objects("NetworkPolicy", NS),
            timeout=20,
            what="the Pod and its NetworkPolicy gone",
        )
        assert fake.objects("Secret", NS) == []
        counters = orchestrator.orchestrator.metrics.counters
        assert counters["network_policy_refusals"] == 1
        assert counters["worker_restarts"] == 0
    finally:
        orchestrator.stop()


def test_the_fence_is_valid_kubernetes_offline(
    fake: FakeKube, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    driver = make_driver(fake, tmp_path, network_policy_cidrs=["10.96.0.0/12"])

    async def scenario() -> None:
        await driver.start(
            await driver.provision(spec()), launch(policy=POLICY, gateway="wss://10.1.1.1:8443")
        )
        await driver.aclose()

    run(scenario())
    sent = [r.body for r in fake.requests if r.method in ("POST", "PATCH") and "networkpolicies" in r.path]
    assert [b["kind"] for b in sent if "kind" in b] == ["NetworkPolicy"]
    [stored] = fake.objects("NetworkPolicy", NS)
    monkeypatch.setattr("socket.socket.connect", no_network)
    for version in SCHEMA_VERSIONS:
        kubernetes_validate.validate(sent[0], version, strict=True)
        kubernetes_validate.validate(stored, version, strict=True)
    broken = json.loads(json.dumps(sent[0]))
    broken["spec"]["egress"][0]["ports"][0]["protocol"] = 53
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, SCHEMA_VERSIONS[-1], strict=True)


def test_the_docs_pod_template_for_confinement_is_kept_and_valid() -> None:
    """docs/orchestrator-kubernetes.md's example ``pod_template`` that lets the Pod confine sessions reaches
    the Pod as written (the driver keeps the template's security contexts) and is valid Kubernetes."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    yaml = pytest.importorskip("yaml")
    text = (Path(__file__).resolve().parents[3] / "docs" / "orchestrator-kubernetes.md").read_text()
    section = text.split("### The worker in the Pod confines the session", 1)[1].split("\n### ", 1)[0]
    [block] = [b for b in section.split("```yaml\n")[1:] if b.startswith("pod_template:")]
    options = {"image": IMAGE, **yaml.safe_load(block.split("```", 1)[0])}
    *others, pod = render_session_manifests(spec(), launch(policy=POLICY), options=options)
    assert pod["kind"] == "Pod" and [o["kind"] for o in others] == ["Secret", "NetworkPolicy"]
    template = options["pod_template"]["spec"]
    assert pod["spec"]["securityContext"] == template["securityContext"]
    assert pod["spec"]["securityContext"]["seccompProfile"]["type"] == "Localhost"
    [worker] = pod["spec"]["containers"]
    assert worker["securityContext"] == template["containers"][0]["securityContext"]
    assert worker["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    kubernetes_validate.validate(pod, SCHEMA_VERSIONS[-1], strict=True)  # appArmorProfile: Kubernetes 1.30+
