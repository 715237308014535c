"""Secrets of realistic shapes, made anew for each run (none is written in the source): what
the secrets part plants in workspace files, command output, MCP results, model output and
error messages, and then looks for everywhere the stack keeps or shows anything."""

from __future__ import annotations

import base64
import json
import secrets
import string
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

ALNUM = string.ascii_letters + string.digits
UPPER_DIGITS = string.ascii_uppercase + string.digits
B64 = string.ascii_letters + string.digits + "+/"


@dataclass(frozen=True, slots=True)
class Planted:
    """One secret: its kind, the line it is planted as, and the value that must never be
    found afterwards (the line's secret part: what a thief would need)."""

    kind: str
    line: str
    value: str

    def spellings(self) -> tuple[str, ...]:
        """The value as it may be written where it leaked: plain, or inside a JSON string."""
        escaped = json.dumps(self.value)[1:-1]
        slashes = escaped.replace("/", "\\/")
        return tuple(dict.fromkeys((self.value, escaped, slashes)))


def _pick(alphabet: str, length: int) -> str:
    return "".join(secrets.choice(alphabet) for _ in range(length))


def _luhn_completed(prefix: str, length: int) -> str:
    body = prefix + _pick(string.digits, length - len(prefix) - 1)
    for check in string.digits:
        digits = body + check
        total = 0
        for index, char in enumerate(reversed(digits)):
            value = int(char) * (2 if index % 2 else 1)
            total += value - 9 if value > 9 else value
        if total % 10 == 0:
            return digits
    raise AssertionError("a check digit always exists")


def _pem(key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey, form: str) -> str:
    formats = {
        "pkcs1": serialization.PrivateFormat.TraditionalOpenSSL,
        "pkcs8": serialization.PrivateFormat.PKCS8,
    }
    return key.private_bytes(
        serialization.Encoding.PEM, formats[form], serialization.NoEncryption()
    ).decode()


def _key_body(pem: str) -> str:
    """A private key's secret: a line from the middle of its base64 body (the first lines
    of a format's body are the same in every key of its kind)."""
    body = pem.strip().splitlines()[1:-1]
    return body[len(body) // 2]


def _card(kind: str, prefix: str, length: int, groups: Iterable[int]) -> Planted:
    digits = _luhn_completed(prefix, length)
    written, at = [], 0
    for size in groups:
        written.append(digits[at : at + size])
        at += size
    number = " ".join(written) if kind.endswith("spaced") else "-".join(written)
    return Planted(kind, f"card: {number}", number)


def _ssn() -> str:
    area = secrets.choice([a for a in range(1, 900) if a != 666])
    return f"{area:03d}-{secrets.randbelow(99) + 1:02d}-{secrets.randbelow(9999) + 1:04d}"


def _nino() -> str:
    first = secrets.choice([c for c in "ABCEGHJKLMNPRSTWXYZ"])
    # HMRC never issues these prefixes, so output safety rightly does not take them for numbers.
    never = {"BG", "GB", "KN", "NK", "NT", "TN", "ZZ"}
    second = secrets.choice([c for c in "ABCEGHJKLMNPRSTWXYZ" if first + c not in never])
    return f"{first}{second} {_pick(string.digits, 2)} {_pick(string.digits, 2)} " + (
        f"{_pick(string.digits, 2)} {secrets.choice('ABCD')}"
    )


def _named(kind: str, name: str, value: str) -> Planted:
    return Planted(kind, f"{name}={value}", value)


def _token(kind: str, prefix: str, alphabet: str, length: int, name: str = "") -> Planted:
    value = prefix + _pick(alphabet, length)
    return Planted(kind, f"{name}={value}" if name else value, value)


def make_secrets() -> list[Planted]:
    """More than fifty secrets, each of a shape seen in real leaks."""
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ec_key = ec.generate_private_key(ec.SECP256R1())
    ed_key = ed25519.Ed25519PrivateKey.generate()
    openssh = ed_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    ).decode()
    pkcs1, pkcs8, ec_pem = _pem(rsa_key, "pkcs1"), _pem(rsa_key, "pkcs8"), _pem(ec_key, "pkcs8")
    account_key = _pem(rsa.generate_private_key(public_exponent=65537, key_size=2048), "pkcs8")
    service_account = json.dumps(
        {
            "type": "service_account",
            "project_id": "acme-prod",
            "private_key_id": _pick("0123456789abcdef", 40),
            "private_key": account_key,
            "client_email": "deployer@acme-prod.iam.gserviceaccount.com",
        }
    )
    hs256 = jwt.encode({"sub": "ana", "role": "admin", "iat": 1_700_000_000}, _pick(ALNUM, 32))
    rs256 = jwt.encode(
        {"sub": "svc", "scope": "payments:write", "exp": 4_000_000_000}, rsa_key, "RS256"
    )
    basic = base64.b64encode(f"deploy:{_pick(ALNUM, 16)}".encode()).decode()
    makers: list[Callable[[], Planted]] = [
        lambda: _token("aws_access_key_id", "AKIA", UPPER_DIGITS, 16, "AWS_ACCESS_KEY_ID"),
        lambda: _token("aws_temporary_key_id", "ASIA", UPPER_DIGITS, 16, "aws_access_key_id"),
        lambda: _named("aws_secret_access_key", "AWS_SECRET_ACCESS_KEY", _pick(B64, 40)),
        lambda: Planted(
            "aws_secret_in_ini", f"aws_secret_access_key = {(key := _pick(B64, 40))}", key
        ),
        lambda: _named("aws_session_token", "AWS_SESSION_TOKEN", _pick(B64, 300)),
        lambda: _token("github_classic_token", "ghp_", ALNUM, 36),
        lambda: _token("github_oauth_token", "gho_", ALNUM, 36),
        lambda: _token("github_app_token", "ghs_", ALNUM, 36),
        lambda: _token("github_user_to_server", "ghu_", ALNUM, 36),
        lambda: _token("github_refresh_token", "ghr_", ALNUM, 76),
        lambda: _token("github_fine_grained", "github_pat_", ALNUM + "_", 82),
        lambda: _token("gitlab_personal_token", "glpat-", ALNUM + "-_", 20),
        lambda: _token("gitlab_runner_token", "glrt-", ALNUM + "-_", 20),
        lambda: _token("gitlab_deploy_token", "gldt-", ALNUM + "-_", 20),
        lambda: _token("slack_bot_token", f"xoxb-{_pick(string.digits, 12)}-", ALNUM, 24),
        lambda: _token("slack_user_token", f"xoxp-{_pick(string.digits, 12)}-", ALNUM, 32),
        lambda: _token(
            "slack_webhook",
            "https://hooks.slack.com/services/"
            + f"T{_pick(UPPER_DIGITS, 8)}/B{_pick(UPPER_DIGITS, 8)}/",
            ALNUM,
            24,
        ),
        lambda: _token("stripe_live_secret", "sk_live_", ALNUM, 99),
        lambda: _token("stripe_test_secret", "sk_test_", ALNUM, 99),
        lambda: _token("stripe_restricted", "rk_live_", ALNUM, 99),
        lambda: _token("stripe_webhook_secret", "whsec_", ALNUM, 32),
        lambda: _token("openai_key", "sk-proj-", ALNUM + "-_", 120),
        lambda: _token("anthropic_key", "sk-ant-api03-", ALNUM + "-_", 93),
        lambda: _token("google_api_key", "AIza", ALNUM + "-_", 35),
        lambda: _token("google_oauth_secret", "GOCSPX-", ALNUM + "-_", 28),
        lambda: _token("sendgrid_key", f"SG.{_pick(ALNUM + '-_', 22)}.", ALNUM + "-_", 43),
        lambda: _token("npm_token", "npm_", ALNUM, 36),
        lambda: _token("pypi_token", "pypi-AgEIcHlwaS5vcmc", ALNUM + "-_", 80),
        lambda: _token("vault_token", "hvs.", ALNUM + "-_", 90),
        lambda: _named("twilio_auth_token", "TWILIO_AUTH_TOKEN", _pick("0123456789abcdef", 32)),
        lambda: _named("datadog_api_key", "DD_API_KEY", _pick("0123456789abcdef", 32)),
        lambda: Planted("jwt_hs256", f"session={hs256}", hs256),
        lambda: Planted("jwt_rs256", f"Authorization: Bearer {rs256}", rs256),
        lambda: _token("bearer_opaque", "Authorization: Bearer ", ALNUM, 40),
        lambda: Planted("basic_auth_header", f"Authorization: Basic {basic}", basic),
        lambda: Planted("rsa_private_key_pkcs1", pkcs1, _key_body(pkcs1)),
        lambda: Planted("rsa_private_key_pkcs8", pkcs8, _key_body(pkcs8)),
        lambda: Planted("ec_private_key", ec_pem, _key_body(ec_pem)),
        lambda: Planted("openssh_private_key", openssh, _key_body(openssh)),
        lambda: Planted("gcp_service_account", service_account, _key_body(account_key)),
        lambda: _conn("postgres", "postgresql://app:{}@db.internal:5432/app"),
        lambda: _conn("mysql", "mysql://root:{}@10.0.0.5:3306/shop"),
        lambda: _conn("mongodb", "mongodb+srv://admin:{}@cluster0.mongodb.net/prod"),
        lambda: _conn("redis_no_user", "redis://:{}@cache.internal:6379/0"),
        lambda: _conn("amqp", "amqp://guest:{}@mq.internal:5672/"),
        lambda: _conn("jdbc_password_param", "jdbc:postgresql://db/app?user=app&password={}"),
        lambda: _conn(
            "azure_storage",
            "DefaultEndpointsProtocol=https;AccountName=acme;AccountKey={};"
            "EndpointSuffix=core.windows.net",
            _pick(B64, 86) + "==",
        ),
        lambda: _named("db_password", "DB_PASSWORD", _pick(ALNUM + "!#%", 20)),
        lambda: _named("client_secret", "OAUTH_CLIENT_SECRET", _pick(ALNUM, 40)),
        lambda: _card("card_visa", "4", 16, (4, 4, 4, 4)),
        lambda: _card("card_mastercard_spaced", "51", 16, (4, 4, 4, 4)),
        lambda: _card("card_amex_spaced", "37", 15, (4, 6, 5)),
        lambda: _card("card_discover", "6011", 16, (4, 4, 4, 4)),
        lambda: _card("card_visa_bare", "4", 16, (16,)),
        lambda: Planted("us_ssn", f"ssn: {(ssn := _ssn())}", ssn),
        lambda: Planted("uk_nino", f"NI number {(nino := _nino())}", nino),
    ]
    made = [make() for make in makers]
    assert len({p.value for p in made}) == len(made)
    return made


def _conn(kind: str, template: str, password: str | None = None) -> Planted:
    secret = password or _pick(ALNUM, 20)
    return Planted(f"connection_{kind}", template.format(secret), secret)


def as_file(planted: list[Planted]) -> str:
    """The secrets as a file of a workspace would hold them."""
    return "".join(p.line + "\n" for p in planted)


def found_in(text: str | bytes, planted: list[Planted]) -> list[Planted]:
    """The secrets whose value is in the text, in any spelling a leak would have."""
    data = text.encode() if isinstance(text, str) else text
    return [p for p in planted if any(s.encode() in data for s in p.spellings())]
