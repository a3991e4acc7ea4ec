"""``GET``/``PUT /v3beta1/organizations/{org_id}/default-platform``."""

from __future__ import annotations

import pytest

from devin_outposts.api.models import DefaultPlatform, Outpost
from devin_outposts_sim.testing import SimHandle


def _path(org: str) -> str:
    return f"/v3beta1/organizations/{org}/default-platform"


UNSET = {"platform": None, "outpost_pool_id": None, "outpost_pool_name": None}


def test_unset_default_is_all_null(sim: SimHandle, api, machine_token: str) -> None:
    org = sim.admin.default_org()
    response = api(machine_token).get(_path(org))
    assert response.status_code == 200
    assert response.json() == UNSET


def test_set_a_hosted_platform(sim: SimHandle, api, orchestrator_token: str) -> None:
    org = sim.admin.default_org()
    client = api(orchestrator_token)
    put = client.put(_path(org), json={"platform": "Ubuntu 24.04"})
    assert put.status_code == 200
    assert put.json() == {"platform": "Ubuntu 24.04", "outpost_pool_id": None, "outpost_pool_name": None}
    assert client.get(_path(org)).json() == put.json()


def test_set_an_outpost_and_get_its_name(
    sim: SimHandle, api, orchestrator_token: str, outpost: Outpost
) -> None:
    org = sim.admin.default_org()
    client = api(orchestrator_token)
    put = client.put(_path(org), json={"outpost_pool_id": outpost.outpost_id})
    assert put.status_code == 200
    expected = {"platform": None, "outpost_pool_id": outpost.outpost_id, "outpost_pool_name": "rhel"}
    assert put.json() == expected
    assert DefaultPlatform.model_validate(client.get(_path(org)).json()).outpost_pool_name == "rhel"
    # Switching to a platform replaces the outpost.
    assert client.put(_path(org), json={"platform": "windows"}).json()["outpost_pool_id"] is None


def test_both_fields_is_422_and_changes_nothing(
    sim: SimHandle, api, orchestrator_token: str, outpost: Outpost
) -> None:
    org = sim.admin.default_org()
    client = api(orchestrator_token)
    client.put(_path(org), json={"platform": "linux"})
    response = client.put(_path(org), json={"platform": "linux", "outpost_pool_id": outpost.outpost_id})
    assert response.status_code == 422
    assert "at most one" in response.json()["detail"]
    assert client.get(_path(org)).json()["platform"] == "linux"


def test_both_null_clears(sim: SimHandle, api, orchestrator_token: str, outpost: Outpost) -> None:
    org = sim.admin.default_org()
    client = api(orchestrator_token)
    client.put(_path(org), json={"outpost_pool_id": outpost.outpost_id})
    cleared = client.put(_path(org), json={"platform": None, "outpost_pool_id": None})
    assert cleared.status_code == 200
    assert cleared.json() == UNSET
    client.put(_path(org), json={"platform": "linux"})
    assert client.put(_path(org), json={}).json() == UNSET  # omitted = null


@pytest.mark.parametrize("outpost_id", ["outpost_env-missing", "nope"])
def test_unknown_outpost_is_422(sim: SimHandle, api, orchestrator_token: str, outpost_id: str) -> None:
    response = api(orchestrator_token).put(
        _path(sim.admin.default_org()), json={"outpost_pool_id": outpost_id}
    )
    assert response.status_code == 422
    assert outpost_id in response.json()["detail"]


def test_another_accounts_outpost_is_422(sim: SimHandle, api, orchestrator_token: str) -> None:
    theirs = sim.admin.create_outpost("theirs", account="acct-other").outpost_id
    response = api(orchestrator_token).put(_path(sim.admin.default_org()), json={"outpost_pool_id": theirs})
    assert response.status_code == 422


@pytest.mark.parametrize(
    "body", [{"platform": 5}, {"platform": ""}, {"outpost_pool_id": ["x"]}, ["platform"]]
)
def test_malformed_bodies_are_422(sim: SimHandle, api, orchestrator_token: str, body: object) -> None:
    response = api(orchestrator_token).put(_path(sim.admin.default_org()), json=body)
    assert response.status_code == 422


def test_unknown_org_is_404(sim: SimHandle, api, orchestrator_token: str) -> None:
    client = api(orchestrator_token)
    for response in (
        client.get(_path("org-0000")),
        client.put(_path("org-0000"), json={"platform": "linux"}),
    ):
        assert response.status_code == 404
        assert response.json() == {"detail": "Organization not found"}


def test_put_needs_the_orchestrator_scope(sim: SimHandle, api, machine_token: str) -> None:
    org = sim.admin.default_org()
    response = api(machine_token).put(_path(org), json={"platform": "linux"})
    assert response.status_code == 403
    assert "account.outposts.orchestrator" in response.json()["detail"]
    assert api(machine_token).get(_path(org)).json() == UNSET


def test_extra_orgs_have_their_own_default(sim: SimHandle, api, orchestrator_token: str) -> None:
    client = api(orchestrator_token)
    first, second = sim.admin.default_org(), sim.admin.create_org()
    assert second != first
    assert second.startswith("org-")
    client.put(_path(first), json={"platform": "linux"})
    assert client.get(_path(second)).json() == UNSET
    assert {o["org_id"] for o in sim.admin.orgs(account="acct-default")} == {first, second}


def test_deleting_the_default_outpost_clears_the_default(
    sim: SimHandle, api, orchestrator_token: str, outpost: Outpost
) -> None:
    org = sim.admin.default_org()
    client = api(orchestrator_token)
    client.put(_path(org), json={"outpost_pool_id": outpost.outpost_id})
    client.delete(f"/opbeta/outposts/outposts/{outpost.outpost_id}")
    assert client.get(_path(org)).json() == UNSET
