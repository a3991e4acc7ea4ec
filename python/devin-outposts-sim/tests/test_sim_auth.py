"""Authentication, scopes, account isolation and error-body shape of the simulated fleet API."""

from __future__ import annotations

import httpx
import pytest

from devin_outposts.api.models import Outpost
from devin_outposts_sim.testing import SimHandle

ORCHESTRATOR = "account.outposts.orchestrator"
MACHINE = "account.outposts.machine"


def test_missing_token_is_401_invalid_token(sim: SimHandle, api) -> None:
    for method, path in [
        ("GET", "/opbeta/outposts/devins"),
        ("GET", "/opbeta/outposts/outposts"),
        ("POST", "/opbeta/outposts/outposts"),
        ("POST", "/opbeta/outposts/devins/devin-x/claim"),
        ("GET", "/v3beta1/organizations/org-x/default-platform"),
    ]:
        response = api().request(method, path)
        assert response.status_code == 401, path
        assert response.json() == {"detail": "Invalid token"}


@pytest.mark.parametrize(
    "header",
    ["Bearer cog_unknownunknownunknownunknownunknownunknownunkn", "Basic dXNlcjpwYXNz", "Bearer", "cog_x"],
)
def test_unknown_or_malformed_token_is_401(sim: SimHandle, header: str) -> None:
    response = httpx.get(f"{sim.url}/opbeta/outposts/devins", headers={"Authorization": header})
    assert response.status_code == 401
    assert response.json() == {"detail": "Invalid token"}
    assert "cog_" not in response.text


def test_token_of_one_simulator_is_not_valid_on_another(make_sim, api) -> None:
    first, second = make_sim(), make_sim()
    token = first.create_token("machine")
    assert api(token, handle=first).get("/opbeta/outposts/devins").status_code == 200
    assert api(token, handle=second).get("/opbeta/outposts/devins").status_code == 401


def test_machine_token_may_read_queue_list_outposts_claim_and_release(
    sim: SimHandle, api, machine_token: str, outpost: Outpost
) -> None:
    client = api(machine_token)
    entry = sim.admin.enqueue(outpost.outpost_id)
    assert client.get("/opbeta/outposts/outposts").status_code == 200
    assert client.get("/opbeta/outposts/devins").status_code == 200
    assert client.get(f"/opbeta/outposts/devins/{entry.session_id}").status_code == 200
    assert (
        client.post(
            f"/opbeta/outposts/devins/{entry.session_id}/claim", json={"acceptor_id": "w"}
        ).status_code
        == 200
    )
    assert (
        client.post(
            f"/opbeta/outposts/devins/{entry.session_id}/release", json={"acceptor_id": "w"}
        ).status_code
        == 200
    )


def test_machine_token_gets_403_naming_the_orchestrator_scope(
    sim: SimHandle, api, machine_token: str, outpost: Outpost
) -> None:
    client = api(machine_token)
    org = sim.admin.default_org()
    attempts = [
        client.post("/opbeta/outposts/outposts", json={"name": "new-one"}),
        client.get(f"/opbeta/outposts/outposts/{outpost.outpost_id}"),
        client.delete(f"/opbeta/outposts/outposts/{outpost.outpost_id}"),
        client.put(f"/v3beta1/organizations/{org}/default-platform", json={"platform": "linux"}),
    ]
    for response in attempts:
        assert response.status_code == 403, response.request.url
        assert ORCHESTRATOR in response.json()["detail"]
    # Nothing happened: the outpost is still there and no second one exists.
    names = [o.name for o in sim.store.accounts.list_outposts("acct-default", 100).items]
    assert names == ["rhel"]


def test_403_comes_before_404_so_ids_cannot_be_probed(sim: SimHandle, api, machine_token: str) -> None:
    response = api(machine_token).get("/opbeta/outposts/outposts/outpost_env-doesnotexist")
    assert response.status_code == 403


def test_token_without_outposts_scopes_is_refused_everywhere(sim: SimHandle, api, outpost: Outpost) -> None:
    client = api(sim.create_token([]))
    entry = sim.admin.enqueue(outpost.outpost_id)
    for response in [
        client.get("/opbeta/outposts/devins"),
        client.get("/opbeta/outposts/outposts"),
        client.post(f"/opbeta/outposts/devins/{entry.session_id}/claim", json={"acceptor_id": "w"}),
    ]:
        assert response.status_code == 403
        assert MACHINE in response.json()["detail"]
    assert sim.admin.session(entry.session_id)["entry"]["status"]["phase"] == "pending"


def test_orchestrator_implies_machine(sim: SimHandle, api, orchestrator_token: str, outpost: Outpost) -> None:
    entry = sim.admin.enqueue(outpost.outpost_id)
    client = api(orchestrator_token)
    assert client.get("/opbeta/outposts/devins").status_code == 200
    assert (
        client.post(
            f"/opbeta/outposts/devins/{entry.session_id}/claim", json={"acceptor_id": "o"}
        ).status_code
        == 200
    )


def test_accounts_are_isolated(sim: SimHandle, api, orchestrator_token: str, outpost: Outpost) -> None:
    entry = sim.admin.enqueue(outpost.outpost_id)
    other = api(sim.create_token("orchestrator", account="acct-other"))
    assert other.get("/opbeta/outposts/outposts").json()["items"] == []
    assert other.get(f"/opbeta/outposts/outposts/{outpost.outpost_id}").status_code == 404
    assert other.delete(f"/opbeta/outposts/outposts/{outpost.outpost_id}").status_code == 404
    assert other.get("/opbeta/outposts/devins").json()["items"] == []
    assert other.get(f"/opbeta/outposts/devins/{entry.session_id}").status_code == 404
    claim = other.post(f"/opbeta/outposts/devins/{entry.session_id}/claim", json={"acceptor_id": "thief"})
    assert claim.status_code == 404
    assert claim.json() == {"detail": "Session not found in queue"}
    # The same name is free in another account.
    assert other.post("/opbeta/outposts/outposts", json={"name": "rhel"}).status_code == 201
    assert sim.admin.session(entry.session_id)["entry"]["status"]["phase"] == "pending"
    # The owner still sees its own.
    assert api(orchestrator_token).get(f"/opbeta/outposts/outposts/{outpost.outpost_id}").status_code == 200


def test_other_accounts_org_is_404(sim: SimHandle, api) -> None:
    org = sim.admin.default_org(account="acct-other")
    client = api(sim.create_token("orchestrator"))
    assert client.get(f"/v3beta1/organizations/{org}/default-platform").status_code == 404


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/nothing/here", 404),
        ("GET", "/opbeta/outposts/devins/x/claim", 405),
        ("PATCH", "/opbeta/outposts/outposts", 405),
        ("PUT", "/opbeta/outposts/devins", 405),
    ],
)
def test_router_errors_have_a_detail_body(
    sim: SimHandle, api, machine_token: str, method, path, status
) -> None:
    response = api(machine_token).request(method, path)
    assert response.status_code == status
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"detail"}
    assert isinstance(body["detail"], str)


def test_validation_errors_have_a_string_detail(sim: SimHandle, api, orchestrator_token: str) -> None:
    client = api(orchestrator_token)
    responses = [
        client.post(
            "/opbeta/outposts/outposts", content=b"{not json", headers={"content-type": "application/json"}
        ),
        client.post("/opbeta/outposts/outposts", json=["a list"]),
        client.get("/opbeta/outposts/devins", params={"first": "0"}),
    ]
    for response in responses:
        assert response.status_code == 422
        assert set(response.json()) == {"detail"}
        assert isinstance(response.json()["detail"], str)


def echoes(response: httpx.Response, secret: str) -> list[str]:
    """Where ``secret`` appears in a response: ``"body"`` and the names of the headers that hold it."""
    found = [name for name, value in response.headers.items() if secret in value]
    return found + (["body"] if secret in response.text else [])


def test_responses_never_echo_the_token(sim: SimHandle, api, machine_token: str, outpost: Outpost) -> None:
    client = api(machine_token)
    entry = sim.admin.enqueue(outpost.outpost_id)
    responses = {
        "list": client.get("/opbeta/outposts/devins"),
        "claim": client.post(f"/opbeta/outposts/devins/{entry.session_id}/claim", json={"acceptor_id": "w"}),
        "create without the scope": client.post("/opbeta/outposts/outposts", json={"name": "x"}),
        "unknown path": client.get("/nope"),
        "bad cursor": client.get("/opbeta/outposts/devins", params={"cursor": "!!"}),
    }
    # Each request carried the token and got the answer its case calls for: none failed before the
    # token was read, and none came back empty, where an echo could not have shown up.
    assert {name: r.status_code for name, r in responses.items()} == {
        "list": 200, "claim": 200, "create without the scope": 403, "unknown path": 404, "bad cursor": 422,
    }  # fmt: skip
    for response in responses.values():
        assert response.request.headers["Authorization"] == f"Bearer {machine_token}"
        assert response.text
    echoed = {name: echoes(r, machine_token) for name, r in responses.items()}
    assert echoed == {name: [] for name in responses}

    # Positive control: the claim answer legitimately carries a secret, the session's fresh connect token,
    # and the same scan finds it there; so the scan above would have found an echoed API token.
    connect_token = responses["claim"].json()["status"]["connect_token"]
    assert connect_token
    assert echoes(responses["claim"], connect_token) == ["body"]


# --- the admin API ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/_sim/config"),
        ("POST", "/_sim/tokens"),
        ("POST", "/_sim/orgs"),
        ("POST", "/_sim/sessions"),
        ("GET", "/_sim/claims"),
        ("POST", "/_sim/reset"),
        ("POST", "/_sim/connect-tokens/check"),
    ],
)
def test_admin_api_requires_the_admin_token(
    sim: SimHandle, orchestrator_token: str, method: str, path: str
) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Bearer {orchestrator_token}"}):
        response = httpx.request(method, f"{sim.url}{path}", headers=headers, json={"scopes": ["machine"]})
        assert response.status_code == 401
        assert response.json() == {"detail": "Invalid admin token"}
    # Nothing was created or reset by the refused calls.
    assert sim.store.accounts.authenticate(orchestrator_token) is not None


def test_admin_health_needs_no_token(sim: SimHandle) -> None:
    assert httpx.get(f"{sim.url}/_sim/health").json() == {"status": "ok"}


def test_admin_config_hides_the_admin_token(sim: SimHandle) -> None:
    config = sim.admin.config()
    assert "admin_token" not in config
    assert sim.admin_token not in str(config)
    assert config["claim_ttl"] == sim.config.claim_ttl


def test_admin_token_creation_validates_scopes(sim: SimHandle) -> None:
    response = httpx.post(
        f"{sim.url}/_sim/tokens",
        headers={"Authorization": f"Bearer {sim.admin_token}"},
        json={"scopes": ["superuser"]},
    )
    assert response.status_code == 422
    info = sim.admin.create_token_info(["account.outposts.machine"], account="acct-x")
    assert info["token"].startswith("cog_")
    assert len(info["token"]) == len("cog_") + 48
    assert info["account_id"] == "acct-x"
    assert info["default_org_id"].startswith("org-")
    assert info["scopes"] == [MACHINE]


def test_admin_client_repr_hides_the_token(sim: SimHandle) -> None:
    assert sim.admin_token not in repr(sim.admin)
