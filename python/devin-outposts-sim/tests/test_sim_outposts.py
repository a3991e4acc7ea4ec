"""Outposts CRUD on all three paths, validation, paging, live status counters and delete semantics."""

from __future__ import annotations

import base64

import pytest

from devin_outposts.api.models import Outpost, OutpostList
from devin_outposts_sim.testing import SimHandle

PATHS = ["/opbeta/outposts/outposts", "/opbeta/outposts", "/opbeta/outposts/pools"]


@pytest.mark.parametrize("path", PATHS)
def test_crud_on_every_path_variant(sim: SimHandle, api, orchestrator_token: str, path: str) -> None:
    client = api(orchestrator_token)
    created = client.post(path, json={"name": "gpu-h200", "platform": "linux", "description": "GPU boxes"})
    assert created.status_code == 201
    outpost = Outpost.model_validate(created.json())
    assert outpost.outpost_id.startswith("outpost_env-")
    assert outpost.metadata.account_id == "acct-default"
    assert isinstance(outpost.metadata.created_at, int)
    assert (outpost.name, outpost.spec.platform, outpost.spec.description) == (
        "gpu-h200",
        "linux",
        "GPU boxes",
    )
    assert (outpost.status.queue_depth, outpost.status.active_claims) == (0, 0)

    # Every path sees what any path created.
    for other in PATHS:
        listed = OutpostList.model_validate(client.get(other).json())
        assert [o.outpost_id for o in listed.items] == [outpost.outpost_id]
        got = client.get(f"{other}/{outpost.outpost_id}")
        assert got.status_code == 200
        assert got.json() == created.json()

    deleted = client.delete(f"{path}/{outpost.outpost_id}")
    assert deleted.status_code == 200
    assert deleted.json()["metadata"]["outpost_id"] == outpost.outpost_id
    for other in PATHS:
        assert client.get(f"{other}/{outpost.outpost_id}").status_code == 404
        assert client.get(other).json()["items"] == []


def test_platform_may_be_null_and_description_omitted(sim: SimHandle, api, orchestrator_token: str) -> None:
    body = api(orchestrator_token).post(PATHS[0], json={"name": "default-box"}).json()
    assert body["spec"]["platform"] is None
    assert body["spec"]["description"] is None


def test_duplicate_name_is_409_naming_the_existing_outpost(
    sim: SimHandle, api, orchestrator_token: str
) -> None:
    client = api(orchestrator_token)
    first = client.post(PATHS[0], json={"name": "rhel", "platform": "linux"}).json()
    for path in PATHS:
        again = client.post(path, json={"name": "rhel", "platform": "windows"})
        assert again.status_code == 409
        assert "rhel" in again.json()["detail"]
        assert first["metadata"]["outpost_id"] in again.json()["detail"]
    assert client.get(PATHS[0]).json()["total"] == 1


def test_name_is_free_again_after_delete(sim: SimHandle, api, orchestrator_token: str) -> None:
    client = api(orchestrator_token)
    first = client.post(PATHS[0], json={"name": "rhel"}).json()["metadata"]["outpost_id"]
    assert client.delete(f"{PATHS[0]}/{first}").status_code == 200
    second = client.post(PATHS[0], json={"name": "rhel"})
    assert second.status_code == 201
    assert second.json()["metadata"]["outpost_id"] != first


@pytest.mark.parametrize("platform", ["Linux", "ubuntu", "", 3, ["linux"], True])
def test_invalid_platform_is_422(sim: SimHandle, api, orchestrator_token: str, platform: object) -> None:
    response = api(orchestrator_token).post(PATHS[0], json={"name": "x", "platform": platform})
    assert response.status_code == 422
    assert "platform" in response.json()["detail"]


@pytest.mark.parametrize("platform", ["linux", "macos", "windows", None])
def test_known_platforms_are_accepted(sim: SimHandle, api, orchestrator_token: str, platform: object) -> None:
    response = api(orchestrator_token).post(PATHS[0], json={"name": f"p-{platform}", "platform": platform})
    assert response.status_code == 201
    assert response.json()["spec"]["platform"] == platform


@pytest.mark.parametrize(
    "name", [None, "", " ", "-leading-dash", "has space", "semi;colon", "a/b", "é", "x" * 64, 7]
)
def test_invalid_name_is_422(sim: SimHandle, api, orchestrator_token: str, name: object) -> None:
    body = {"platform": "linux"} if name is None else {"name": name, "platform": "linux"}
    response = api(orchestrator_token).post(PATHS[0], json=body)
    assert response.status_code == 422
    assert "name" in response.json()["detail"]


def test_longest_valid_name_is_accepted(sim: SimHandle, api, orchestrator_token: str) -> None:
    assert (
        api(orchestrator_token).post(PATHS[0], json={"name": "a" + "b.c_d-" * 10 + "ab"}).status_code == 201
    )


def test_description_must_be_a_string(sim: SimHandle, api, orchestrator_token: str) -> None:
    client = api(orchestrator_token)
    assert client.post(PATHS[0], json={"name": "x", "description": 5}).status_code == 422
    assert client.post(PATHS[0], json={"name": "x", "description": "d" * 1001}).status_code == 422


def test_allowed_org_ids_must_name_organizations_of_the_account(
    sim: SimHandle, api, orchestrator_token: str
) -> None:
    client = api(orchestrator_token)
    bad = client.post(PATHS[0], json={"name": "x", "allowed_org_ids": ["org-nope"]})
    assert bad.status_code == 422
    assert "organization" in bad.json()["detail"]
    foreign = sim.admin.default_org(account="acct-other")
    assert client.post(PATHS[0], json={"name": "x", "allowed_org_ids": [foreign]}).status_code == 422
    org = sim.admin.default_org()
    good = client.post(PATHS[0], json={"name": "x", "allowed_org_ids": [org]})
    assert good.status_code == 201
    assert good.json()["spec"]["allowed_org_ids"] == [org]


def test_get_and_delete_of_unknown_id_are_404(sim: SimHandle, api, orchestrator_token: str) -> None:
    client = api(orchestrator_token)
    for path in PATHS:
        for response in (
            client.get(f"{path}/outpost_env-missing"),
            client.delete(f"{path}/outpost_env-missing"),
        ):
            assert response.status_code == 404
            assert response.json() == {"detail": "Outpost not found"}


def test_second_delete_is_404(sim: SimHandle, api, orchestrator_token: str, outpost: Outpost) -> None:
    client = api(orchestrator_token)
    assert client.delete(f"{PATHS[1]}/{outpost.outpost_id}").status_code == 200
    assert client.delete(f"{PATHS[1]}/{outpost.outpost_id}").status_code == 404


# --- the list envelope and paging ----------------------------------------------------------------


def test_list_pages_with_first_and_after(sim: SimHandle, api, machine_token: str) -> None:
    created = [sim.admin.create_outpost(f"o{i:02d}").outpost_id for i in range(7)]
    client = api(machine_token)
    seen: list[str] = []
    after = None
    pages = 0
    while True:
        params = {"first": 3, **({"after": after} if after else {})}
        page = client.get(PATHS[0], params=params).json()
        assert set(page) == {"items", "end_cursor", "has_next_page", "total"}
        assert page["total"] == 7
        assert len(page["items"]) <= 3
        seen += [item["metadata"]["outpost_id"] for item in page["items"]]
        pages += 1
        if not page["has_next_page"]:
            break
        after = page["end_cursor"]
    assert seen == created  # creation order, no overlap, nothing missing
    assert pages == 3


def test_list_default_page_is_100(sim: SimHandle, api, machine_token: str) -> None:
    for i in range(101):
        sim.store.accounts.create_outpost("acct-default", f"bulk-{i}")
    page = api(machine_token).get(PATHS[0]).json()
    assert len(page["items"]) == 100
    assert page["has_next_page"] is True
    rest = api(machine_token).get(PATHS[0], params={"after": page["end_cursor"]}).json()
    assert len(rest["items"]) == 1
    assert rest["has_next_page"] is False


@pytest.mark.parametrize("first", ["0", "201", "-1", "ten", "1.5"])
def test_list_first_out_of_range_is_422(sim: SimHandle, api, machine_token: str, first: str) -> None:
    response = api(machine_token).get(PATHS[0], params={"first": first})
    assert response.status_code == 422
    assert "first" in response.json()["detail"]


@pytest.mark.parametrize("first", ["1", "200"])
def test_list_first_bounds_are_accepted(sim: SimHandle, api, machine_token: str, first: str) -> None:
    assert api(machine_token).get(PATHS[0], params={"first": first}).status_code == 200


@pytest.mark.parametrize(
    "after", ["garbage!", base64.b64encode(b"v1:1.0").decode(), base64.b64encode(b"o1:x").decode()]
)
def test_list_bad_after_is_422(sim: SimHandle, api, machine_token: str, after: str) -> None:
    response = api(machine_token).get(PATHS[0], params={"after": after})
    assert response.status_code == 422
    assert response.json() == {"detail": "Invalid cursor"}


def test_empty_list_has_null_end_cursor(sim: SimHandle, api, machine_token: str) -> None:
    assert api(machine_token).get(PATHS[0]).json() == {
        "items": [],
        "end_cursor": None,
        "has_next_page": False,
        "total": 0,
    }


# --- live status counters ----------------------------------------------------------------------------


def _status(client, outpost_id: str) -> tuple[int, int]:
    body = client.get(f"{PATHS[0]}/{outpost_id}").json()
    listed = {o["metadata"]["outpost_id"]: o for o in client.get(PATHS[0]).json()["items"]}
    assert listed[outpost_id]["status"] == body["status"]  # list and get agree
    return body["status"]["queue_depth"], body["status"]["active_claims"]


def test_status_counters_are_live(sim: SimHandle, api, orchestrator_token: str, outpost: Outpost) -> None:
    client = api(orchestrator_token)
    oid = outpost.outpost_id
    assert _status(client, oid) == (0, 0)
    a, b, c = (sim.admin.enqueue(oid).session_id for dummy in range(3))
    assert _status(client, oid) == (3, 0)
    client.post(f"/opbeta/outposts/devins/{a}/claim", json={"acceptor_id": "w1"})
    assert _status(client, oid) == (2, 1)
    sim.admin.set_status(b, "terminated")  # finished rows are not waiting work
    assert _status(client, oid) == (1, 1)
    client.post(f"/opbeta/outposts/devins/{a}/release", json={"acceptor_id": "w1"})
    assert _status(client, oid) == (2, 0)
    sim.admin.tombstone(c)
    assert _status(client, oid) == (1, 0)
    # Another outpost's sessions do not count.
    other = sim.admin.create_outpost("other").outpost_id
    sim.admin.enqueue(other)
    assert _status(client, oid) == (1, 0)


def test_active_claims_drop_when_a_claim_expires(make_sim, api, wait_until) -> None:
    fast = make_sim(claim_ttl=0.3, sweep_interval=0.05)
    client = api(fast.create_token("orchestrator"), handle=fast)
    oid = fast.admin.create_outpost("exp").outpost_id
    sid = fast.admin.enqueue(oid).session_id
    client.post(f"/opbeta/outposts/devins/{sid}/claim", json={"acceptor_id": "w1"})
    assert _status(client, oid) == (0, 1)
    wait_until(lambda: any(r["action"] == "expire" for r in fast.admin.claims(session_id=sid)))
    assert _status(client, oid) == (1, 0)


# --- delete semantics ------------------------------------------------------------------------------------


def test_delete_tombstones_the_outposts_entries(
    sim: SimHandle, api, orchestrator_token: str, outpost: Outpost, watch
) -> None:
    client = api(orchestrator_token)
    oid = outpost.outpost_id
    pending = sim.admin.enqueue(oid).session_id
    claimed = sim.admin.enqueue(oid).session_id
    token = client.post(f"/opbeta/outposts/devins/{claimed}/claim", json={"acceptor_id": "w1"}).json()[
        "status"
    ]["connect_token"]
    keep = sim.admin.enqueue(sim.admin.create_outpost("keep").outpost_id).session_id
    cursor = client.get("/opbeta/outposts/devins").json()["cursor"]

    before = client.delete(f"{PATHS[0]}/{oid}").json()
    assert before["status"] == {"queue_depth": 1, "active_claims": 1}  # as it was just before

    listed = [e["metadata"]["session_id"] for e in client.get("/opbeta/outposts/devins").json()["items"]]
    assert listed == [keep]
    for sid in (pending, claimed):
        gone = client.get(f"/opbeta/outposts/devins/{sid}")
        assert gone.status_code == 404
        assert gone.json() == {"detail": "Session not found in queue"}
        assert (
            client.post(f"/opbeta/outposts/devins/{sid}/claim", json={"acceptor_id": "w2"}).status_code == 404
        )
    assert (
        client.post(f"/opbeta/outposts/devins/{claimed}/release", json={"acceptor_id": "w1"}).status_code
        == 404
    )
    assert not sim.store.gateway.check_connect_token(claimed, token)

    deleted: set[str] = set()

    def both_deleted(event: dict) -> bool:
        if event["type"] == "DELETED":
            deleted.add(event["object"]["metadata"]["session_id"])
        return deleted == {pending, claimed}

    with watch(orchestrator_token, cursor=cursor) as stream:
        events = stream.until(both_deleted)
    assert keep not in {e["object"]["metadata"]["session_id"] for e in events}
