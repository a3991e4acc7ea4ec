"""``GET /v3/enterprise/organizations``: the token's account's organizations, paged with ``first``/``after``,
and the organization names the admin API gives them."""

from __future__ import annotations

import base64
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import pytest

from devin_outposts_sim.state.db import DEFAULT_ORG_NAME
from devin_outposts_sim.state.store import Store
from devin_outposts_sim.testing import SimHandle

PATH = "/v3/enterprise/organizations"
OTHER = "acct-other"


def b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode()


def page(client: httpx.Client, **params: Any) -> dict[str, Any]:
    response = client.get(PATH, params=params)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def walk(client: httpx.Client, first: int) -> tuple[list[dict[str, Any]], int]:
    """Every item, following ``end_cursor`` while ``has_next_page``; and how many pages it took."""
    items: list[dict[str, Any]] = []
    after = None
    for pages in range(1, 1000):
        body = page(client, first=first, **({"after": after} if after else {}))
        items += body["items"]
        if not body["has_next_page"]:
            return items, pages
        assert body["end_cursor"] and body["end_cursor"] != after
        after = body["end_cursor"]
    raise AssertionError("the list never ended")


def expected(sim: SimHandle, account: str = "acct-default") -> list[dict[str, Any]]:
    """The account's organizations as the admin API has them, in the wire's shape."""
    return [{"org_id": org["org_id"], "name": org["name"]} for org in sim.admin.orgs(account=account)]


def test_the_answer_has_exactly_the_contracts_fields(sim: SimHandle, api, machine_token: str) -> None:
    default = sim.admin.default_org()
    research = sim.admin.create_org(name="Research")
    body = page(api(machine_token))
    assert body == {
        "items": [{"org_id": default, "name": DEFAULT_ORG_NAME}, {"org_id": research, "name": "Research"}],
        "end_cursor": body["end_cursor"],
        "has_next_page": False,
    }
    assert isinstance(body["end_cursor"], str) and body["end_cursor"]
    assert "total" not in body


def test_names_default_and_given_and_duplicates(sim: SimHandle, api, machine_token: str) -> None:
    sim.admin.create_org(name="Research")
    unnamed = sim.admin.create_org_info()
    sim.admin.create_org(name="Research")
    sim.admin.create_org(name="Ünïcode & spaces, 研究")
    assert unnamed["name"] == "Organization 3"
    names = [item["name"] for item in page(api(machine_token))["items"]]
    assert names == [DEFAULT_ORG_NAME, "Research", "Organization 3", "Research", "Ünïcode & spaces, 研究"]
    assert [org["name"] for org in sim.admin.orgs(account="acct-default")] == names
    assert [org["default"] for org in sim.admin.orgs(account="acct-default")] == [True] + [False] * 4


def test_pages_of_one_cover_every_org_once_in_creation_order(sim: SimHandle, api, machine_token: str) -> None:
    for index in range(6):
        sim.admin.create_org(name=f"org {index}")
    client = api(machine_token)
    items, pages = walk(client, first=1)
    assert pages == 7
    assert items == expected(sim)
    assert len({item["org_id"] for item in items}) == 7
    # The same list in pages of 3, and in one page.
    assert walk(client, first=3) == (items, 3)
    assert walk(client, first=200) == (items, 1)


def test_has_next_page_and_end_cursor_at_the_end(sim: SimHandle, api, machine_token: str) -> None:
    sim.admin.create_org(name="second")
    client = api(machine_token)
    first = page(client, first=1)
    assert (len(first["items"]), first["has_next_page"]) == (1, True)
    last = page(client, first=1, after=first["end_cursor"])
    assert (len(last["items"]), last["has_next_page"]) == (1, False)
    assert last["end_cursor"] not in (None, first["end_cursor"])
    # After the last row: an empty page, whose end_cursor is null.
    empty = {"items": [], "end_cursor": None, "has_next_page": False}
    assert page(client, first=1, after=last["end_cursor"]) == empty


def test_default_page_size_is_100(sim: SimHandle, api, machine_token: str) -> None:
    for index in range(100):
        sim.store.accounts.create_org("acct-default", f"filler {index:03d}")
    client = api(machine_token)
    body = page(client)
    assert (len(body["items"]), body["has_next_page"]) == (100, True)
    rest = page(client, after=body["end_cursor"])
    assert (len(rest["items"]), rest["has_next_page"]) == (1, False)
    assert body["items"] + rest["items"] == expected(sim)


def test_a_cursor_stays_valid_as_orgs_are_added_and_after_a_reset(
    sim: SimHandle, api, machine_token: str
) -> None:
    client = api(machine_token)
    cursor = page(client)["end_cursor"]  # after the default org
    late = sim.admin.create_org(name="late")
    assert page(client, after=cursor)["items"] == [{"org_id": late, "name": "late"}]
    # A reset wipes the orgs, but a cursor issued before it never skips the ones made after it.
    sim.admin.reset()
    token = sim.create_token("machine")
    fresh = page(api(token), after=cursor)
    assert fresh["items"] == expected(sim)


@pytest.mark.parametrize("first", ["0", "201", "-1", "abc", "1.5", ""])
def test_first_outside_1_to_200_is_422(sim: SimHandle, api, machine_token: str, first: str) -> None:
    response = api(machine_token).get(PATH, params={"first": first})
    assert response.status_code == 422
    assert response.json() == {"detail": "first must be an integer between 1 and 200"}


@pytest.mark.parametrize("first", ["1", "200"])
def test_first_bounds_are_accepted(sim: SimHandle, api, machine_token: str, first: str) -> None:
    assert api(machine_token).get(PATH, params={"first": first}).status_code == 200


@pytest.mark.parametrize(
    "after",
    [
        "not-a-cursor!",
        b64("o1:1"),  # an outposts-list cursor is not an organizations-list cursor
        b64("v1:1781050000.0"),  # nor is a queue cursor
        b64("g1:-1"),
        b64("g1:x"),
        b64("g1: 1"),
        b64("g1:"),
        "%%%",
    ],
)
def test_an_invalid_cursor_is_422(sim: SimHandle, api, machine_token: str, after: str) -> None:
    response = api(machine_token).get(PATH, params={"after": after})
    assert response.status_code == 422
    assert response.json() == {"detail": "Invalid cursor"}


def test_an_empty_after_is_the_first_page(sim: SimHandle, api, machine_token: str) -> None:
    client = api(machine_token)
    assert page(client, after="") == page(client)


def test_an_outposts_cursor_is_refused_on_the_organizations_list(
    sim: SimHandle, api, machine_token: str
) -> None:
    sim.admin.create_outpost("one", "linux")
    sim.admin.create_outpost("two", "linux")
    client = api(machine_token)
    outposts = client.get("/opbeta/outposts/outposts", params={"first": 1}).json()
    assert client.get(PATH, params={"after": outposts["end_cursor"]}).status_code == 422
    orgs = page(client, first=1)
    assert client.get("/opbeta/outposts/outposts", params={"after": orgs["end_cursor"]}).status_code == 422


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer cog_unknownunknownunknownunknownunknownunknownunkn"},
        {"Authorization": "Basic dXNlcjpwYXNz"},
        {"Authorization": "Bearer"},
    ],
    ids=["missing", "unknown", "basic", "empty"],
)
def test_a_missing_or_unknown_token_is_401(sim: SimHandle, headers: dict[str, str]) -> None:
    response = httpx.get(sim.url + PATH, headers=headers)
    assert response.status_code == 401
    assert response.json() == {"detail": "Invalid token"}
    assert "cog_" not in response.text


def test_401_comes_before_the_query_is_checked(sim: SimHandle) -> None:
    response = httpx.get(sim.url + PATH, params={"first": "0", "after": "bad"})
    assert (response.status_code, response.json()) == (401, {"detail": "Invalid token"})


def test_machine_and_orchestrator_tokens_may_list(sim: SimHandle, api) -> None:
    for scope in ("machine", "orchestrator"):
        assert page(api(sim.create_token(scope)))["items"] == expected(sim)


def test_a_token_without_outposts_scopes_is_403(sim: SimHandle, api) -> None:
    response = api(sim.create_token([])).get(PATH, params={"first": "0"})
    assert response.status_code == 403
    assert response.json() == {
        "detail": "Token lacks the account.outposts.machine scope (Use outpost machine), required to list "
        "organizations"
    }


def test_another_accounts_orgs_never_appear(sim: SimHandle, api) -> None:
    mine = sim.admin.create_org(name="Shared name")
    theirs = [sim.admin.create_org(account=OTHER, name="Shared name") for dummy in range(3)]
    sim.admin.create_org(name="mine too")
    my_client = api(sim.create_token("machine"))
    their_client = api(sim.create_token("orchestrator", account=OTHER))
    my_items, dummy = walk(my_client, first=1)
    their_items, dummy = walk(their_client, first=1)
    assert my_items == expected(sim)
    assert their_items == expected(sim, OTHER)
    assert mine in {item["org_id"] for item in my_items}
    assert not {item["org_id"] for item in my_items} & {item["org_id"] for item in their_items}
    assert set(theirs) < {item["org_id"] for item in their_items}
    # A cursor issued to the other account is only a position: it shows my orgs after it, never theirs.
    their_cursor = page(their_client, first=1)["end_cursor"]
    shown = page(my_client, after=their_cursor)["items"]
    assert shown and all(item in my_items for item in shown)


def test_the_response_never_echoes_the_token(sim: SimHandle, api, machine_token: str) -> None:
    response = api(machine_token).get(PATH)
    assert machine_token not in response.text
    assert machine_token not in str(response.headers)


# --- the admin API ------------------------------------------------------------------------------------


def test_admin_create_and_list_carry_the_name(sim: SimHandle, api) -> None:
    response = api(sim.admin_token).post("/_sim/orgs", json={"account_id": OTHER, "name": "Platform"})
    assert response.status_code == 201
    created = response.json()
    assert set(created) == {"org_id", "account_id", "name"}
    assert (created["account_id"], created["name"]) == (OTHER, "Platform")
    listed = api(sim.admin_token).get("/_sim/orgs", params={"account_id": OTHER}).json()["items"]
    assert listed == [
        {"org_id": listed[0]["org_id"], "account_id": OTHER, "name": DEFAULT_ORG_NAME, "default": True},
        {"org_id": created["org_id"], "account_id": OTHER, "name": "Platform", "default": False},
    ]


@pytest.mark.parametrize(
    ("name", "detail"),
    [
        ("", "name must be a non-empty string or null"),
        ("   ", "name must be a non-empty string or null"),
        (42, "name must be a non-empty string or null"),
        ("x" * 201, "name must be at most 200 characters"),
        ("two\nlines", "name must not contain control characters"),
        ("tab\there", "name must not contain control characters"),
    ],
)
def test_admin_refuses_a_bad_name(sim: SimHandle, api, name: Any, detail: str) -> None:
    before = sim.admin.orgs()
    response = api(sim.admin_token).post("/_sim/orgs", json={"name": name})
    assert (response.status_code, response.json()) == (422, {"detail": detail})
    assert sim.admin.orgs() == before


def test_a_200_character_name_is_accepted(sim: SimHandle) -> None:
    assert sim.admin.create_org_info(name="x" * 200)["name"] == "x" * 200


# --- a database of schema version 2 -----------------------------------------------------------------


SCHEMA_2_ORGS = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE accounts (account_id TEXT PRIMARY KEY, default_org_id TEXT, created_at REAL NOT NULL);
CREATE TABLE orgs (
    org_id TEXT PRIMARY KEY, account_id TEXT NOT NULL, default_platform TEXT,
    default_outpost_id TEXT, created_at REAL NOT NULL);
INSERT INTO meta VALUES ('schema_version', '2');
INSERT INTO accounts VALUES
    ('acct-a', 'org-aaaa000000000001', 100.0), ('acct-b', 'org-bbbb000000000001', 100.0);
INSERT INTO orgs (org_id, account_id, created_at) VALUES
    ('org-aaaa000000000002', 'acct-a', 200.0),
    ('org-aaaa000000000001', 'acct-a', 100.0),
    ('org-bbbb000000000001', 'acct-b', 100.0),
    ('org-aaaa000000000003', 'acct-a', 300.0);
"""


def test_an_older_database_gets_names_and_an_order(tmp_path: Path) -> None:
    path = tmp_path / "v2.db"
    conn = sqlite3.connect(path)
    conn.executescript(SCHEMA_2_ORGS)
    conn.close()
    store = Store(str(path))
    try:
        listed = store.accounts.list_org_page("acct-a", 200)
        assert listed["items"] == [
            {"org_id": "org-aaaa000000000001", "name": DEFAULT_ORG_NAME},
            {"org_id": "org-aaaa000000000002", "name": "Organization 2"},
            {"org_id": "org-aaaa000000000003", "name": "Organization 3"},
        ]
        assert store.accounts.list_org_page("acct-b", 200)["items"] == [
            {"org_id": "org-bbbb000000000001", "name": DEFAULT_ORG_NAME}
        ]
        created = store.accounts.create_org("acct-a", "New")
        last = store.accounts.list_org_page("acct-a", 200)["items"][-1]
        assert last == {"org_id": created["org_id"], "name": "New"}
    finally:
        store.close()
