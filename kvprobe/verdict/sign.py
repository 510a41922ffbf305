"""OpenSSH signatures (SSHSIG, PROTOCOL.sshsig) over the exact bytes of verdict.json.

A signature made here verifies with the standard tool:
    ssh-keygen -Y verify -f allowed_signers -I SIGNER -n kvprobe-verdict -s verdict.json.sig < verdict.json
and `verify_file` checks it the same way (magic, version, namespace, SHA-512 of the message, an
Ed25519 signature over the SSHSIG-wrapped hash, the key listed in an allowed_signers file).

Keys: `--key PATH` (an OpenSSH Ed25519 private key), else KVPROBE_SIGNING_KEY (a path, or the key
text itself, as CI secrets usually are), else one key created once in the user's config directory
(0600) and listed in the allowed_signers file beside it.
"""

from __future__ import annotations

import base64
import fnmatch
import getpass
import hashlib
import os
import re
import socket
import struct
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from kvprobe import settings
from kvprobe.disk import write_atomic
from kvprobe.errors import ConfigError, SignatureError

NAMESPACE = "kvprobe-verdict"
MAGIC = b"SSHSIG"
SIG_VERSION = 1
HASH_ALG = "sha512"
KEY_TYPE = "ssh-ed25519"
ARMOR_BEGIN = "-----BEGIN SSH SIGNATURE-----"
ARMOR_END = "-----END SSH SIGNATURE-----"
KEY_ENV = settings.SIGNING_KEY
PASSPHRASE_ENV = settings.SIGNING_KEY_PASSPHRASE
ALLOWED_SIGNERS_ENV = settings.ALLOWED_SIGNERS
_HASHES = {"sha512": hashlib.sha512, "sha256": hashlib.sha256}


# -- SSH wire format -------------------------------------------------------------------------

def _string(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise SignatureError("signature file is truncated or not an SSH signature")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def uint32(self) -> int:
        return struct.unpack(">I", self.take(4))[0]

    def string(self) -> bytes:
        return self.take(self.uint32())

    def done(self) -> bool:
        return self.pos == len(self.data)


def public_wire(key: Ed25519PublicKey) -> bytes:
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return _string(KEY_TYPE.encode()) + _string(raw)


def _public_from_wire(wire: bytes) -> Ed25519PublicKey:
    reader = _Reader(wire)
    kind = reader.string().decode(errors="replace")
    if kind != KEY_TYPE:
        raise SignatureError(f"signed with a {kind} key: kvprobe verdicts are signed with Ed25519 ({KEY_TYPE})")
    raw = reader.string()
    if len(raw) != 32 or not reader.done():
        raise SignatureError("malformed Ed25519 public key in the signature")
    return Ed25519PublicKey.from_public_bytes(raw)


def fingerprint(wire: bytes) -> str:
    """OpenSSH's `SHA256:...` fingerprint of a public key blob (as `ssh-keygen -l` prints it)."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(wire).digest()).decode().rstrip("=")


def public_line(key: Ed25519PublicKey) -> str:
    """`ssh-ed25519 AAAA...`: the public key as it appears in .pub and allowed_signers files."""
    return _line_of_wire(public_wire(key))


def _line_of_wire(wire: bytes) -> str:
    return f"{KEY_TYPE} {base64.b64encode(wire).decode()}"


def _signed_data(namespace: str, hash_alg: str, message: bytes) -> bytes:
    digest = _HASHES[hash_alg](message).digest()
    return MAGIC + _string(namespace.encode()) + _string(b"") + _string(hash_alg.encode()) + _string(digest)


# -- sign and verify --------------------------------------------------------------------------

def sign(message: bytes, key: Ed25519PrivateKey, namespace: str = NAMESPACE) -> str:
    """The armored SSHSIG signature of `message`, as `ssh-keygen -Y sign` writes it."""
    signature = key.sign(_signed_data(namespace, HASH_ALG, message))
    blob = (MAGIC + struct.pack(">I", SIG_VERSION) + _string(public_wire(key.public_key()))
            + _string(namespace.encode()) + _string(b"") + _string(HASH_ALG.encode())
            + _string(_string(KEY_TYPE.encode()) + _string(signature)))
    b64 = base64.b64encode(blob).decode()
    lines = [b64[i:i + 70] for i in range(0, len(b64), 70)]
    return "\n".join([ARMOR_BEGIN, *lines, ARMOR_END]) + "\n"


@dataclass(frozen=True)
class ParsedSignature:
    public_wire: bytes
    namespace: str
    hash_alg: str
    signature: bytes

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.public_wire)

    @property
    def public_line(self) -> str:
        return _line_of_wire(self.public_wire)


def parse_signature(armored: str) -> ParsedSignature:
    text = armored.strip()
    if not (text.startswith(ARMOR_BEGIN) and text.endswith(ARMOR_END)):
        raise SignatureError(f"not an SSH signature (expected a {ARMOR_BEGIN} block)")
    body = "".join(text[len(ARMOR_BEGIN):-len(ARMOR_END)].split())
    try:
        blob = base64.b64decode(body, validate=True)
    except ValueError:
        raise SignatureError("SSH signature block is not valid base64") from None
    reader = _Reader(blob)
    if reader.take(6) != MAGIC:
        raise SignatureError("not an SSHSIG signature (bad magic)")
    version = reader.uint32()
    if version != SIG_VERSION:
        raise SignatureError(f"SSHSIG version {version} is not supported (expected {SIG_VERSION})")
    wire = reader.string()
    namespace = reader.string().decode(errors="replace")
    reader.string()  # reserved
    hash_alg = reader.string().decode(errors="replace")
    sig_reader = _Reader(reader.string())
    if not reader.done():
        raise SignatureError("trailing bytes after the SSH signature")
    sig_kind = sig_reader.string().decode(errors="replace")
    signature = sig_reader.string()
    if sig_kind != KEY_TYPE or len(signature) != 64:
        raise SignatureError(f"signature type {sig_kind} is not supported: kvprobe verifies Ed25519 only")
    if hash_alg not in _HASHES:
        raise SignatureError(f"hash algorithm {hash_alg!r} is not allowed (sha512 or sha256)")
    return ParsedSignature(wire, namespace, hash_alg, signature)


@dataclass(frozen=True)
class Signer:
    fingerprint: str
    principals: list[str]


def verify(message: bytes, armored: str, allowed: list[AllowedSigner], *, namespace: str = NAMESPACE,
           principal: str | None = None, allowed_source: str = "allowed_signers") -> Signer:
    """Check `armored` over `message` and that its key is allowed for `namespace` (and `principal`)."""
    sig = parse_signature(armored)
    if sig.namespace != namespace:
        raise SignatureError(f"signature namespace is {sig.namespace!r}, expected {namespace!r}: "
                             "this signature was made for something else")
    try:
        _public_from_wire(sig.public_wire).verify(sig.signature, _signed_data(namespace, sig.hash_alg, message))
    except InvalidSignature:
        raise SignatureError("signature does not match the verdict's bytes: the verdict was changed after "
                             "it was signed") from None
    now = datetime.now(UTC)
    matches = [a for a in allowed if a.key_wire == sig.public_wire and a.allows(namespace, now)]
    if principal is not None:
        matches = [a for a in matches if a.matches_principal(principal)]
    if not matches:
        who = f" as {principal!r}" if principal else ""
        # The fix is the exact line to add: only the reader can say the key is one they expect.
        line = f'{principal or "kvprobe-signer"} namespaces="{namespace}" {sig.public_line}'
        raise SignatureError(f"signed by {sig.fingerprint}, which {allowed_source} does not allow{who} for "
                             f"namespace {namespace!r}: the signer is not trusted; if that key is one "
                             f"you expect, add this line to {allowed_source}: {line}")
    principals = [principal] if principal else sorted({p for a in matches for p in a.principals})
    return Signer(sig.fingerprint, principals)


# -- allowed_signers (ssh-keygen(1), ALLOWED SIGNERS) ------------------------------------------

_TOKEN = re.compile(r'(?:[^\s"]|"[^"]*")+')
_KEY_TYPES = re.compile(r"^(ssh-|ecdsa-|sk-|rsa-sha2-)")


@dataclass(frozen=True)
class AllowedSigner:
    principals: list[str]
    key_wire: bytes
    namespaces: list[str] | None
    valid_after: datetime | None
    valid_before: datetime | None

    def matches_principal(self, principal: str) -> bool:
        return any(fnmatch.fnmatchcase(principal, p) for p in self.principals)

    def allows(self, namespace: str, when: datetime) -> bool:
        if self.namespaces is not None and not any(fnmatch.fnmatchcase(namespace, n) for n in self.namespaces):
            return False
        if self.valid_after and when < self.valid_after:
            return False
        return not (self.valid_before and when > self.valid_before)


def _split_options(text: str) -> list[str]:
    out, cur, quoted = [], "", False
    for ch in text:
        if ch == '"':
            quoted = not quoted
        if ch == "," and not quoted:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return [o for o in out if o]


def _ssh_time(value: str) -> datetime:
    value = value.rstrip("Zz")
    for fmt in ("%Y%m%d%H%M%S", "%Y%m%d%H%M", "%Y%m%d"):
        try:
            return datetime.strptime(value, fmt).replace(tzinfo=UTC)
        except ValueError:
            continue
    raise ValueError(value)


def parse_allowed_signers(text: str, source: str = "allowed_signers") -> list[AllowedSigner]:
    """Lines `principals [options] keytype base64 [comment]`; certificate authorities are skipped
    (kvprobe signs with plain keys)."""
    out: list[AllowedSigner] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        tokens = _TOKEN.findall(line)
        if len(tokens) < 3:
            raise ConfigError([f"{source}:{number}: expected `principals [options] keytype key`"])
        options: list[str] = []
        rest = tokens[1:]
        if not _KEY_TYPES.match(rest[0]):
            options, rest = _split_options(rest[0]), rest[1:]
        if len(rest) < 2:
            raise ConfigError([f"{source}:{number}: expected a key type and a base64 key"])
        namespaces = valid_after = valid_before = None
        skip = False
        for option in options:
            name, _, value = option.partition("=")
            value = value.strip('"')
            name = name.lower()
            try:
                if name == "namespaces":
                    namespaces = [n for n in value.split(",") if n]
                elif name == "valid-after":
                    valid_after = _ssh_time(value)
                elif name == "valid-before":
                    valid_before = _ssh_time(value)
                elif name == "cert-authority":
                    skip = True
            except ValueError:
                raise ConfigError([f"{source}:{number}: {name}: {value!r} is not a time like 20250101"]) from None
        if skip or rest[0] != KEY_TYPE:
            continue
        try:
            wire = base64.b64decode(rest[1], validate=True)
        except ValueError:
            raise ConfigError([f"{source}:{number}: the key is not valid base64"]) from None
        out.append(AllowedSigner(tokens[0].split(","), wire, namespaces, valid_after, valid_before))
    return out


def allowed_signers_line(principal: str, key: Ed25519PublicKey) -> str:
    return f'{principal} namespaces="{NAMESPACE}" {public_line(key)}'


# -- keys -------------------------------------------------------------------------------------

def config_dir() -> Path:
    """$XDG_CONFIG_HOME/kvprobe, else ~/.config/kvprobe."""
    return settings.config_home() / "kvprobe"


def default_key_path() -> Path:
    return config_dir() / "signing_key"


def default_allowed_signers() -> Path:
    return config_dir() / "allowed_signers"


@dataclass
class SigningKey:
    key: Ed25519PrivateKey
    source: str  # where it came from, for messages (never the key itself)
    created: bool = False

    @property
    def fingerprint(self) -> str:
        return fingerprint(public_wire(self.key.public_key()))


def _parse_private(data: bytes, source: str) -> Ed25519PrivateKey:
    passphrase = settings.signing_key_passphrase()
    try:
        key = serialization.load_ssh_private_key(data, password=passphrase.encode() if passphrase else None)
    except TypeError:
        raise ConfigError([f"{source}: the key is passphrase-protected: set {PASSPHRASE_ENV}"]) from None
    except ValueError as exc:
        if passphrase and "checksum" in str(exc):
            raise ConfigError([f"{source}: wrong passphrase in {PASSPHRASE_ENV}"]) from None
        raise ConfigError([f"{source}: not an OpenSSH private key ({exc}); make one with "
                           "`ssh-keygen -t ed25519 -f PATH`"]) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError([f"{source}: a {type(key).__name__.removesuffix('PrivateKey')} key: kvprobe signs with "
                           "Ed25519 only (`ssh-keygen -t ed25519`)"])
    return key


def _read_key_file(path: Path, source: str) -> Ed25519PrivateKey:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError([f"{source}: cannot read the signing key {path}: {exc.strerror}"]) from None
    return _parse_private(data, source)


def create_key(path: Path) -> Ed25519PrivateKey:
    """A new Ed25519 key at `path` (0600, directory 0700), its .pub, and its allowed_signers line."""
    key = Ed25519PrivateKey.generate()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    principal = f"{getpass.getuser()}@{socket.gethostname()}"
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                            serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # never overwrite a key
    with os.fdopen(fd, "wb") as fh:
        fh.write(pem)
    path.with_name(path.name + ".pub").write_text(f"{public_line(key.public_key())} {principal}\n")
    with open(path.parent / "allowed_signers", "a") as fh:
        fh.write(allowed_signers_line(principal, key.public_key()) + "\n")
    return key


def load_signing_key(path: str | Path | None = None) -> SigningKey:
    if path is not None:
        return SigningKey(_read_key_file(Path(path), f"--key {path}"), str(path))
    env = settings.signing_key()
    if env:
        if "PRIVATE KEY-----" in env:
            return SigningKey(_parse_private(env.encode(), KEY_ENV), f"${KEY_ENV}")
        return SigningKey(_read_key_file(Path(env), f"{KEY_ENV}={env}"), env)
    default = default_key_path()
    if default.exists():
        return SigningKey(_read_key_file(default, str(default)), str(default))
    try:
        key = create_key(default)
    except OSError as exc:
        raise ConfigError([f"cannot create a signing key at {default}: {exc.strerror}: pass --key PATH "
                           f"or set {KEY_ENV}"]) from None
    return SigningKey(key, str(default), created=True)


def load_allowed_signers(path: str | Path | None = None) -> tuple[list[AllowedSigner], str]:
    """The allowed signers from --allowed-signers, else $KVPROBE_ALLOWED_SIGNERS, else the file beside
    the default key; a missing list is an error, since a signature from anyone is no evidence."""
    if path is not None:
        file, source = Path(path), f"--allowed-signers {path}"
    elif env := settings.allowed_signers():
        file, source = Path(env), f"{ALLOWED_SIGNERS_ENV}={env}"
    else:
        file = default_allowed_signers()
        source = str(file)
    try:
        text = file.read_text()
    except FileNotFoundError:
        raise ConfigError([f"{source}: no allowed signers file: pass --allowed-signers FILE (lines like "
                           f"`NAME namespaces=\"{NAMESPACE}\" ssh-ed25519 AAAA...`)"]) from None
    except OSError as exc:
        raise ConfigError([f"{source}: cannot read: {exc.strerror}"]) from None
    return parse_allowed_signers(text, str(file)), str(file)


def sign_file(path: Path, key: SigningKey) -> Path:
    """Sign the exact bytes of `path` into `path.sig` (written atomically)."""
    return write_atomic(path.with_name(path.name + ".sig"), sign(path.read_bytes(), key.key).encode())
