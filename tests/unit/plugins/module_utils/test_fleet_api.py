# -*- coding: utf-8 -*-
# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT

"""The private client: the exact HTTP calls it sends, retries, both paginations and error mapping."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import socket
import ssl
import threading
from urllib.error import URLError

import pytest

from ansible_collections.devin.outposts.plugins.module_utils import _fleet_api
from ansible_collections.devin.outposts.plugins.module_utils._fleet_api import (
    FleetAPIError,
    FleetClient,
    normalize_api_url,
    outpost_differences,
)
from ansible_collections.devin.outposts.tests.unit.plugins.fleet_fakes import (
    API,
    TOKEN,
    outpost,
    outpost_page,
    session,
    session_page,
)

OUTPOSTS = "/opbeta/outposts/outposts"
LIST_OUTPOSTS = OUTPOSTS + "?first=100"
QUEUE = "/opbeta/outposts/devins"


def client(**kwargs):
    kwargs.setdefault("api_url", API)
    kwargs.setdefault("token", TOKEN)
    return FleetClient(**kwargs)


# --- construction -------------------------------------------------------------------------------


@pytest.mark.parametrize("given, expected", [
    ("https://api.devin.ai", "https://api.devin.ai"),
    ("https://api.devin.ai/", "https://api.devin.ai"),
    ("https://api.devin.ai/opbeta/outposts/", "https://api.devin.ai"),
    ("https://api.devin.ai/opbeta", "https://api.devin.ai"),
    ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
    ("  https://proxy.example/devin/  ", "https://proxy.example/devin"),
    (None, "https://api.devin.ai"),
])
def test_normalize_api_url(given, expected):
    assert normalize_api_url(given) == expected


def test_api_url_needs_a_scheme():
    with pytest.raises(FleetAPIError, match="api_url must start with https://"):
        client(api_url="api.devin.ai")


@pytest.mark.parametrize("token", [None, ""])
def test_a_token_is_required(token):
    with pytest.raises(FleetAPIError) as info:
        client(token=token)
    assert str(info.value) == ("Could not use the fleet API: no API token: set the token option or the "
                               "DEVIN_OUTPOSTS_TOKEN environment variable")


def test_missing_ca_path_is_reported_before_any_request(tmp_path):
    with pytest.raises(FleetAPIError, match="ca_path .* is not a file"):
        client(ca_path=str(tmp_path / "nope.pem"))


def test_repr_hides_the_token():
    assert TOKEN not in repr(client())
    assert "token=set" in repr(client())


# --- the exact requests ---------------------------------------------------------------------------


def test_get_sends_bearer_token_and_transport_options(api, tmp_path):
    bundle = tmp_path / "ca.pem"
    bundle.write_text(u"-----BEGIN CERTIFICATE-----\n")
    api.expect("GET", LIST_OUTPOSTS, json=outpost_page([]))
    client(validate_certs=False, ca_path=str(bundle), timeout=12).list_outposts()
    (call,) = api.calls
    assert call.headers == {"Authorization": "Bearer " + TOKEN, "Accept": "application/json"}
    assert call.body is None
    assert call.options == dict(
        use_proxy=True,
        timeout=12.0,
        validate_certs=False,
        ca_path=str(bundle),
        http_agent="devin.outposts/0.1.0",
        follow_redirects="none",
        use_netrc=False,
    )


def test_post_sends_json_body_and_content_type(api):
    created = outpost("gpu-h200", platform="linux", description="H200s")
    api.expect("POST", OUTPOSTS, json=created)
    assert client().create_outpost("gpu-h200", platform="linux", description="H200s") == created
    (call,) = api.calls
    assert call.headers["Content-Type"] == "application/json"
    assert call.headers["Authorization"] == "Bearer " + TOKEN
    assert call.body == {"name": "gpu-h200", "platform": "linux", "description": "H200s"}


def test_create_without_platform_sends_null_and_omits_description(api):
    api.expect("POST", OUTPOSTS, json=outpost("rhel", platform=None))
    client().create_outpost("rhel")
    assert api.calls[0].body == {"name": "rhel", "platform": None}


def test_delete_quotes_the_id(api):
    api.expect("DELETE", OUTPOSTS + "/outpost_env-a%2Fb", status=204)
    assert client().delete_outpost("outpost_env-a/b") is True


def test_get_outpost_by_id(api):
    api.expect("GET", OUTPOSTS + "/outpost_env-1", json=outpost("x", "outpost_env-1"))
    assert client().get_outpost("outpost_env-1")["spec"]["name"] == "x"


def test_default_platform_paths_and_bodies(api):
    path = "/v3beta1/organizations/org-abc/default-platform"
    api.expect("GET", path, json={"platform": None, "outpost_pool_id": None, "outpost_pool_name": None})
    api.expect("PUT", path, json={"platform": "linux", "outpost_pool_id": None, "outpost_pool_name": None})
    api.expect("PUT", path, json={"platform": None, "outpost_pool_id": None, "outpost_pool_name": None})
    fleet = client()
    fleet.get_default_platform("org-abc")
    fleet.set_default_platform("org-abc", platform="linux")
    fleet.set_default_platform("org-abc")
    assert [c.body for c in api.calls] == [None, {"platform": "linux", "outpost_pool_id": None},
                                           {"platform": None, "outpost_pool_id": None}]
    assert api.calls[1].headers["Content-Type"] == "application/json"


def test_default_platform_refuses_both_without_a_request(api):
    with pytest.raises(FleetAPIError, match="at most one of platform and outpost_pool_id"):
        client().set_default_platform("org-abc", platform="linux", outpost_pool_id="outpost_env-1")
    assert api.calls == []


# --- not found is data ----------------------------------------------------------------------------


def test_not_found_is_data(api):
    api.expect("GET", OUTPOSTS + "/outpost_env-gone", status=404, json={"detail": "Outpost not found"})
    api.expect("DELETE", OUTPOSTS + "/outpost_env-gone", status=404, json={"detail": "Outpost not found"})
    api.expect("GET", LIST_OUTPOSTS, json=outpost_page([outpost("a")]))
    fleet = client()
    assert fleet.get_outpost("outpost_env-gone") is None
    assert fleet.delete_outpost("outpost_env-gone") is False
    assert fleet.find_outpost(name="b") is None


@pytest.mark.parametrize("term, key", [("gpu", "name"), ("outpost_env-gpu", "id")])
def test_resolve_outpost_by_name_or_id(api, term, key):
    api.expect("GET", LIST_OUTPOSTS, json=outpost_page([outpost("other"), outpost("gpu")]))
    assert client().resolve_outpost(term)["spec"]["name"] == "gpu"


@pytest.mark.parametrize("term, message", [
    ("nope", "Could not find outpost nope: no outpost with this name exists in the account"),
    ("outpost_env-nope", "Could not find outpost outpost_env-nope: no outpost with this id exists in the account"),
])
def test_resolve_outpost_unknown(api, term, message):
    api.expect("GET", LIST_OUTPOSTS, json=outpost_page([outpost("gpu")]))
    with pytest.raises(FleetAPIError) as info:
        client().resolve_outpost(term)
    assert str(info.value) == message


# --- pagination -----------------------------------------------------------------------------------


def test_outposts_pagination_follows_end_cursor(api):
    api.expect("GET", LIST_OUTPOSTS, json=outpost_page([outpost("a"), outpost("b")], "c2", True))
    api.expect("GET", OUTPOSTS + "?after=c2&first=100", json=outpost_page([outpost("c")], "c3", False))
    names = [o["spec"]["name"] for o in client().list_outposts()]
    assert names == ["a", "b", "c"]


def test_outposts_pagination_that_does_not_advance_fails(api):
    api.expect("GET", LIST_OUTPOSTS, json=outpost_page([outpost("a")], "c2", True))
    api.expect("GET", OUTPOSTS + "?after=c2&first=100", json=outpost_page([outpost("b")], "c2", True))
    with pytest.raises(FleetAPIError, match="did not advance end_cursor"):
        client().list_outposts()


def test_queue_pagination_upserts_boundary_rows_later_page_wins(api):
    page1 = [session("devin-1"), session("devin-2"), session("devin-3")]
    fresher = session("devin-3", phase="claimed", acceptor_id="w1", updated_at=1781050009)
    page2 = [fresher, session("devin-4")]
    api.expect("GET", QUEUE + "?first=3&outpost=outpost_env-gpu&phase=pending",
               json=session_page(page1, "cur-1", True))
    api.expect("GET", QUEUE + "?cursor=cur-1&first=3&outpost=outpost_env-gpu&phase=pending",
               json=session_page(page2, "cur-2", False))
    sessions, cursor = client().list_sessions(outpost_id="outpost_env-gpu", phase="pending", page_size=3)
    assert [s["metadata"]["session_id"] for s in sessions] == ["devin-1", "devin-2", "devin-3", "devin-4"]
    assert sessions[2] == fresher
    assert cursor == "cur-2"


def test_queue_listing_starts_at_a_given_cursor_and_passes_acceptor(api):
    api.expect("GET", QUEUE + "?acceptor_id=orch-1&cursor=start&first=100&phase=claimed",
               json=session_page([], None, False))
    sessions, cursor = client().list_sessions(phase="claimed", acceptor_id="orch-1", cursor="start")
    assert (sessions, cursor) == ([], "start")


def test_queue_pagination_that_does_not_advance_fails(api):
    api.expect("GET", QUEUE + "?first=1", json=session_page([session("devin-1")], "c", True))
    api.expect("GET", QUEUE + "?cursor=c&first=1", json=session_page([session("devin-1")], "c", True))
    with pytest.raises(FleetAPIError, match="did not advance the cursor"):
        client().list_sessions(page_size=1)


@pytest.mark.parametrize("size", [0, 201, -5])
def test_queue_page_size_bounds(api, size):
    with pytest.raises(FleetAPIError, match="page size must be between 1 and 200"):
        client().list_sessions(page_size=size)


# --- retries --------------------------------------------------------------------------------------


def test_retries_5xx_with_exponential_backoff(api, sleeps):
    api.expect("GET", LIST_OUTPOSTS, status=503, json={"detail": "busy"})
    api.expect("GET", LIST_OUTPOSTS, status=502, raw="<html>bad gateway</html>")
    api.expect("GET", LIST_OUTPOSTS, status=500, json={"detail": "oops"})
    api.expect("GET", LIST_OUTPOSTS, json=outpost_page([outpost("a")]))
    assert len(client().list_outposts()) == 1
    assert sleeps == [0.5, 1.0, 2.0]


def test_backoff_is_capped(api, sleeps):
    for dummy in range(5):
        api.expect("GET", LIST_OUTPOSTS, status=503, json={"detail": "busy"})
    api.expect("GET", LIST_OUTPOSTS, json=outpost_page([]))
    client(retries=5, backoff_base=1.0, backoff_max=5.0).list_outposts()
    assert sleeps == [1.0, 2.0, 4.0, 5.0, 5.0]


def test_gives_up_after_the_retries_with_the_last_error(api, sleeps):
    for dummy in range(4):
        api.expect("GET", LIST_OUTPOSTS, status=503, json={"detail": "Service Unavailable"})
    with pytest.raises(FleetAPIError) as info:
        client().list_outposts()
    assert str(info.value) == "Could not list outposts: 503 Service Unavailable"
    assert info.value.status == 503
    assert len(sleeps) == 3


@pytest.mark.parametrize("header, expected", [
    ("7", 7.0),
    ("0", 0.0),
    ("600", 60.0),  # bounded
    ("soon", 0.5),  # unparseable: normal backoff
])
def test_429_honours_retry_after(api, sleeps, header, expected):
    api.expect("GET", LIST_OUTPOSTS, status=429, json={"detail": "slow down"}, headers={"Retry-After": header})
    api.expect("GET", LIST_OUTPOSTS, json=outpost_page([]))
    client().list_outposts()
    assert sleeps == [expected]


def test_retry_after_http_date(api, sleeps, monkeypatch):
    monkeypatch.setattr(_fleet_api.time, "time", lambda: 1781050000.0)
    api.expect("GET", LIST_OUTPOSTS, status=503, headers={"Retry-After": "Wed, 10 Jun 2026 00:06:50 GMT"})
    api.expect("GET", LIST_OUTPOSTS, json=outpost_page([]))
    client().list_outposts()
    assert sleeps == [10.0]  # 1781050010 is 2026-06-10 00:06:50 UTC


@pytest.mark.parametrize("reason", [ConnectionRefusedError(111, "Connection refused"), socket.timeout("timed out")])
def test_connection_errors_are_retried(api, sleeps, reason):
    api.expect("GET", LIST_OUTPOSTS, exc=URLError(reason))
    api.expect("GET", LIST_OUTPOSTS, exc=ConnectionResetError(104, "Connection reset by peer"))
    api.expect("GET", LIST_OUTPOSTS, json=outpost_page([]))
    client().list_outposts()
    assert sleeps == [0.5, 1.0]


def test_unreachable_api_message(api, sleeps):
    for dummy in range(4):
        api.expect("GET", LIST_OUTPOSTS, exc=URLError(ConnectionRefusedError(111, "Connection refused")))
    with pytest.raises(FleetAPIError) as info:
        client().list_outposts()
    assert str(info.value) == ("Could not list outposts: cannot reach https://api.test.invalid: "
                               "[Errno 111] Connection refused")
    assert info.value.status is None


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 422])
def test_client_errors_are_not_retried(api, sleeps, status):
    api.expect("GET", LIST_OUTPOSTS, status=status, json={"detail": "no"})
    with pytest.raises(FleetAPIError):
        client().list_outposts()
    assert sleeps == []


def test_create_is_not_replayed_after_a_5xx(api, sleeps):
    api.expect("POST", OUTPOSTS, status=502, json={"detail": "Bad Gateway"})
    with pytest.raises(FleetAPIError, match="Could not create outpost gpu: 502 Bad Gateway"):
        client().create_outpost("gpu")
    assert sleeps == []


def test_create_is_not_replayed_after_a_timeout(api, sleeps):
    api.expect("POST", OUTPOSTS, exc=URLError(socket.timeout("timed out")))
    with pytest.raises(FleetAPIError, match="cannot reach"):
        client().create_outpost("gpu")
    assert sleeps == []


@pytest.mark.parametrize("first", [
    dict(status=429, json={"detail": "slow down"}),
    dict(exc=URLError(ConnectionRefusedError(111, "Connection refused"))),
    dict(exc=URLError(socket.gaierror(-2, "Name or service not known"))),
])
def test_create_is_retried_when_the_server_cannot_have_acted(api, sleeps, first):
    api.expect("POST", OUTPOSTS, **first)
    api.expect("POST", OUTPOSTS, json=outpost("gpu"))
    assert client().create_outpost("gpu")["spec"]["name"] == "gpu"
    assert len(sleeps) == 1


def test_delete_is_retried_and_a_404_after_the_retry_counts_as_gone(api, sleeps):
    api.expect("DELETE", OUTPOSTS + "/outpost_env-1", status=503, json={"detail": "busy"})
    api.expect("DELETE", OUTPOSTS + "/outpost_env-1", status=404, json={"detail": "Outpost not found"})
    assert client().delete_outpost("outpost_env-1") is False


# --- error mapping --------------------------------------------------------------------------------


@pytest.mark.parametrize("status, body, message", [
    (403, {"detail": "token lacks scope account.outposts.orchestrator"},
     "Could not create outpost gpu-h200: 403 token lacks scope account.outposts.orchestrator"),
    (401, {"detail": "Invalid token"}, "Could not create outpost gpu-h200: 401 Invalid token"),
    (409, {"detail": "An outpost named gpu-h200 already exists"},
     "Could not create outpost gpu-h200: 409 An outpost named gpu-h200 already exists"),
    (422, {"detail": [{"loc": ["body", "platform"], "msg": "Input should be 'linux', 'macos' or 'windows'"}]},
     "Could not create outpost gpu-h200: 422 body.platform: Input should be 'linux', 'macos' or 'windows'"),
    (400, "plain text problem", "Could not create outpost gpu-h200: 400 plain text problem"),
    (418, "", "Could not create outpost gpu-h200: 418 HTTP 418"),
    (400, {"error": "x"}, 'Could not create outpost gpu-h200: 400 {"error": "x"}'),
])
def test_error_mapping(api, status, body, message):
    if isinstance(body, dict):
        api.expect("POST", OUTPOSTS, status=status, json=body)
    else:
        api.expect("POST", OUTPOSTS, status=status, raw=body)
    with pytest.raises(FleetAPIError) as info:
        client().create_outpost("gpu-h200")
    assert str(info.value) == message
    assert info.value.status == status
    assert info.value.operation == "create outpost gpu-h200"
    assert info.value.to_result() == dict(http_status=status, detail=info.value.detail)


def test_delete_error_names_the_outpost_and_its_id(api):
    api.expect("DELETE", OUTPOSTS + "/outpost_env-1", status=403, json={"detail": "forbidden"})
    with pytest.raises(FleetAPIError) as info:
        client().delete_outpost("outpost_env-1", name="gpu")
    assert str(info.value) == "Could not delete outpost gpu (outpost_env-1): 403 forbidden"


def test_redirects_are_not_followed(api):
    api.expect("GET", LIST_OUTPOSTS, status=301, headers={"Location": "https://elsewhere.example/x"})
    with pytest.raises(FleetAPIError) as info:
        client().list_outposts()
    assert str(info.value) == ("Could not list outposts: 301 redirected to https://elsewhere.example/x; "
                               "set api_url to the API's base URL")


# What urllib raises for each kind of TLS failure (the texts OpenSSL 3 gives, as Python wraps them).
WRONG_PROTOCOL = [
    ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number (_ssl.c:1006)"),  # OpenSSL 3.0/3.1
    ssl.SSLError(1, "[SSL: RECORD_LAYER_FAILURE] record layer failure (_ssl.c:1020)"),  # OpenSSL 3.2+
    ssl.SSLError(1, "[SSL: PACKET_LENGTH_TOO_LONG] packet length too long (_ssl.c:1000)"),
    ssl.SSLEOFError(8, "[SSL: UNEXPECTED_EOF_WHILE_READING] EOF occurred in violation of protocol (_ssl.c:1006)"),
]


@pytest.mark.parametrize("reason", WRONG_PROTOCOL, ids=["wrong-version", "record-layer", "packet-length", "eof"])
def test_tls_to_a_port_that_does_not_speak_tls_says_so(api, sleeps, reason):
    api.expect("GET", LIST_OUTPOSTS, exc=URLError(reason))
    with pytest.raises(FleetAPIError) as info:
        client().list_outposts()
    assert str(info.value) == (
        "Could not list outposts: no TLS handshake with https://api.test.invalid ({0}): the server did not "
        "speak TLS; is api_url https:// where the server speaks http://, or is the port wrong?".format(reason))
    assert "ca_path" not in str(info.value)  # a CA bundle cannot fix a server that speaks plain HTTP
    assert sleeps == []  # and retrying cannot either


@pytest.mark.parametrize("wrapped", [True, False], ids=["in-urlerror", "bare"])
def test_certificate_verification_failures_point_to_ca_path(api, sleeps, wrapped):
    reason = ssl.SSLCertVerificationError(
        1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate in certificate "
           "chain (_ssl.c:1006)")
    api.expect("GET", LIST_OUTPOSTS, exc=URLError(reason) if wrapped else reason)
    with pytest.raises(FleetAPIError) as info:
        client().list_outposts()
    assert str(info.value) == (
        "Could not list outposts: the TLS certificate of https://api.test.invalid was not accepted ({0}): set "
        "ca_path to the CA bundle that signed the API's certificate".format(reason))
    assert sleeps == []


def test_a_certificate_for_another_host_names_the_host_not_ca_path(api, sleeps):
    reason = ssl.SSLCertVerificationError(
        1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: Hostname mismatch, certificate is not "
           "valid for 'api.test.invalid'. (_ssl.c:1006)")
    api.expect("GET", LIST_OUTPOSTS, exc=URLError(reason))
    with pytest.raises(FleetAPIError) as info:
        client().list_outposts()
    assert str(info.value) == (
        "Could not list outposts: the TLS certificate of https://api.test.invalid was not accepted ({0}): the "
        "certificate is not for the host in api_url; use the host name it was issued for".format(reason))
    assert "ca_path" not in str(info.value)


def test_other_tls_errors_are_reported_without_a_guess(api, sleeps):
    reason = ssl.SSLError(1, "[SSL: TLSV1_ALERT_INTERNAL_ERROR] tlsv1 alert internal error (_ssl.c:1006)")
    api.expect("GET", LIST_OUTPOSTS, exc=URLError(reason))
    with pytest.raises(FleetAPIError) as info:
        client().list_outposts()
    assert str(info.value) == "Could not list outposts: TLS error talking to https://api.test.invalid: {0}".format(
        reason)
    assert sleeps == []


@pytest.fixture
def plain_http_port():
    """A loopback port that answers like uvicorn or nginx on plain HTTP: one 400 to whatever arrives first."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, dummy = server.accept()
            except socket.timeout:
                continue
            with conn:
                conn.settimeout(5)
                try:
                    conn.recv(4096)  # the TLS ClientHello, which is not an HTTP request line
                    conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        server.close()


@pytest.mark.parametrize("validate_certs", [True, False])
def test_a_real_tls_handshake_with_a_plain_http_port(plain_http_port, validate_certs):
    """No fake open_url: the real client opens a TLS connection to a loopback port that speaks plain HTTP."""
    url = "https://127.0.0.1:{0}".format(plain_http_port)
    with pytest.raises(FleetAPIError) as info:
        client(api_url=url, validate_certs=validate_certs, timeout=10, retries=0).list_outposts()
    message = str(info.value)
    assert message.startswith("Could not list outposts: no TLS handshake with {0} (".format(url))
    assert message.endswith("is api_url https:// where the server speaks http://, or is the port wrong?")
    assert "ca_path" not in message


def test_a_non_json_answer_is_an_error(api):
    api.expect("GET", LIST_OUTPOSTS, raw="<html>captive portal</html>")
    with pytest.raises(FleetAPIError, match="not JSON"):
        client().list_outposts()


FAILURES = [
    dict(status=401, json={"detail": "Invalid token " + TOKEN}),
    dict(status=403, raw="forbidden for Bearer " + TOKEN),
    dict(status=500, json={"detail": {"token": TOKEN}}),
    dict(exc=URLError("tunnel to proxy failed for " + TOKEN)),
    dict(status=200, raw="not json " + TOKEN),
]


@pytest.mark.parametrize("failure", FAILURES)
def test_the_token_never_appears_in_a_message(api, sleeps, failure):
    for dummy in range(4 if failure.get("status", 500) >= 500 or "exc" in failure else 1):
        api.expect("GET", LIST_OUTPOSTS, **failure)
    with pytest.raises(FleetAPIError) as info:
        client().list_outposts()
    assert TOKEN not in str(info.value)
    assert TOKEN not in repr(info.value.to_result())
    assert "<redacted>" in str(info.value)


# --- helpers --------------------------------------------------------------------------------------


@pytest.mark.parametrize("desired, expected", [
    (dict(name="gpu", platform="linux", description="H200"), []),
    (dict(name="gpu", platform=None, description=None), []),
    (dict(name="gpu", platform="macos", description=None), [("platform", "linux", "macos")]),
    (dict(name="gpu", platform="windows", description="B200"),
     [("description", "H200", "B200"), ("platform", "linux", "windows")]),
])
def test_outpost_differences_ignore_unset_options(desired, expected):
    assert outpost_differences(outpost("gpu", platform="linux", description="H200"), desired) == expected
