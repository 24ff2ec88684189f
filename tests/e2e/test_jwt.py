"""TLS and JWT identity through the real Envoy: keys and a certificate made at run time."""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from tests.support.http import chat_body, metric, post, scrape
from tests.support.messages import MODE_IDS, MODES, with_messages
from tests.support.stack import example_policy, start_stack, write_policy
from tooling.stack.local import LocalStack

ISSUER = "https://issuer.slogate.test"
CHAT = "/v1/chat/completions"
TENANT_SERIES_MAX = 6


def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def self_signed(key: rsa.RSAPrivateKey) -> bytes:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    return certificate.public_bytes(serialization.Encoding.PEM)


class Identity:
    def __init__(self, work: Path) -> None:
        self.signing_key = rsa_key()
        self.other_key = rsa_key()
        tls_key = rsa_key()
        self.cert_path = work / "cert.pem"
        self.cert_path.write_bytes(self_signed(tls_key))
        self.key_path = work / "key.pem"
        self.key_path.write_bytes(
            tls_key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.TraditionalOpenSSL,
                serialization.NoEncryption(),
            )
        )
        jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.signing_key.public_key()))
        jwk.update({"kid": "k1", "alg": "RS256", "use": "sig"})
        self.jwks_path = work / "jwks.json"
        self.jwks_path.write_text(json.dumps({"keys": [jwk]}))
        self.ssl = ssl.create_default_context(cafile=str(self.cert_path))

    def token(self, key: rsa.RSAPrivateKey | None = None, **overrides: Any) -> str:
        claims = {
            "iss": ISSUER,
            "aud": "slogate",
            "sub": "user-1",
            "org": "acme",
            "plan": "critical",
            "exp": int(time.time()) + 600,
        }
        claims.update(overrides)
        return jwt.encode(claims, key or self.signing_key, algorithm="RS256", headers={"kid": "k1"})


@pytest.fixture(scope="module", params=MODES, ids=MODE_IDS)
def secured(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[tuple[LocalStack, Identity]]:
    """In both ext_proc message modes: with one, the claims come with the body message."""
    work = tmp_path_factory.mktemp("jwt")
    identity = Identity(work)
    raw = with_messages(example_policy(), request.param)
    raw["tls"] = {"cert_file": str(identity.cert_path), "key_file": str(identity.key_path)}
    raw["jwt"] = {
        "issuer": ISSUER,
        "audiences": ["slogate"],
        "jwks_file": str(identity.jwks_path),
        "tenant_claim": "org",
        "tier_claim": "plan",
    }
    # The example's 4 tenants and 2 more have tenant labels of their own; the rest "other".
    raw["telemetry"] = {"tenant_series_max": TENANT_SERIES_MAX}
    policy = work / "policy.yaml"
    write_policy(policy, raw)
    stack = start_stack(work, policy, exact_tokenizer=False)
    yield stack, identity
    stack.stop()


def call(stack: LocalStack, identity: Identity, token: str | None, **headers: str) -> Any:
    sent = dict(headers)
    if token is not None:
        sent["authorization"] = f"Bearer {token}"
    return post(
        stack.url, CHAT, chat_body("hello"), key=None, headers=sent, ssl_context=identity.ssl
    )


def test_valid_token_names_tenant_and_tier_over_https(
    secured: tuple[LocalStack, Identity],
) -> None:
    stack, identity = secured
    assert stack.url.startswith("https://")
    reply = call(stack, identity, identity.token())
    assert reply.status == 200, reply.body
    saw = json.loads(reply.headers["x-sim-saw-headers"])
    assert saw["x-slogate-tenant"] == "acme" and saw["x-slogate-tier"] == "critical"
    # The caller's budget: the critical tier's defaults, counting down per subject.
    assert reply.headers["x-ratelimit-limit-requests"] == "600"
    again = call(stack, identity, identity.token())
    assert int(again.headers["x-ratelimit-remaining-requests"]) < int(
        reply.headers["x-ratelimit-remaining-requests"]
    )
    # A JWT tenant has its own tenant label (up to the cap: the next test).
    samples = scrape(stack.metrics_url)
    assert metric(samples, "slogate_budget_decisions_total", tenant="acme") >= 2
    assert metric(samples, "slogate_budget_decisions_total", tenant="jwt") == 0


def test_jwt_tenants_past_the_cap_share_tenant_other(secured: tuple[LocalStack, Identity]) -> None:
    stack, identity = secured
    orgs = [f"org-{i}" for i in range(5)]
    for org in orgs:
        reply = call(stack, identity, identity.token(org=org, sub=f"user-of-{org}"))
        assert reply.status == 200, reply.body
        saw = json.loads(reply.headers["x-sim-saw-headers"])
        assert saw["x-slogate-tenant"] == org  # folded in the metrics only
    samples = scrape(stack.metrics_url)
    tenants = {
        dict(labels)["tenant"]
        for name, labels in samples
        if name == "slogate_budget_decisions_total"
    }
    assert len(tenants) <= TENANT_SERIES_MAX + 1 and "org-0" in tenants
    # Two places beyond the example's 4 tenants: org-0 took one, acme (the test above) or
    # org-1 the other; at least three of the five share "other".
    assert metric(samples, "slogate_budget_decisions_total", tenant="other") >= 3


@pytest.mark.parametrize(
    "case", ["expired", "wrong_audience", "bad_signature", "missing", "wrong_issuer"]
)
def test_bad_or_missing_tokens_get_401_from_envoy(
    secured: tuple[LocalStack, Identity], case: str
) -> None:
    stack, identity = secured
    token = {
        "expired": lambda: identity.token(exp=int(time.time()) - 600),  # past the 60 s skew
        "wrong_audience": lambda: identity.token(aud="someone-else"),
        "bad_signature": lambda: identity.token(key=identity.other_key),
        "missing": lambda: None,
        "wrong_issuer": lambda: identity.token(iss="https://evil.test"),
    }[case]()
    reply = call(stack, identity, token)
    assert reply.status == 401, reply.body
    assert "x-sim-pool" not in reply.headers  # never reached a pool
    assert "x-slogate-reason" not in reply.headers  # Envoy refused it, not the sidecar
    error = reply.json()["error"]
    assert error["code"] == "invalid_api_key" and error["message"].startswith("Invalid")


def test_client_headers_cannot_spoof_identity(secured: tuple[LocalStack, Identity]) -> None:
    stack, identity = secured
    reply = call(
        stack,
        identity,
        identity.token(plan="sheddable"),
        **{"x-slogate-tenant": "someone-else", "x-slogate-tier": "critical"},
    )
    assert reply.status == 200
    saw = json.loads(reply.headers["x-sim-saw-headers"])
    assert saw["x-slogate-tenant"] == "acme" and saw["x-slogate-tier"] == "sheddable"


def test_plain_http_is_not_served(secured: tuple[LocalStack, Identity]) -> None:
    stack, _ = secured
    with pytest.raises(Exception):  # noqa: B017 - any transport failure will do
        post(stack.url.replace("https://", "http://"), CHAT, chat_body(), timeout_s=5)
