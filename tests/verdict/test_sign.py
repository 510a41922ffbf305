"""SSHSIG signatures checked by the standard tool (ssh-keygen -Y verify) and by `kvprobe verify`."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from verdict_inputs import Measurements

from kvprobe.cli import main
from kvprobe.errors import ConfigError, SignatureError
from kvprobe.verdict.build import verdict_bytes, write_verdict
from kvprobe.verdict.sign import (
    NAMESPACE,
    allowed_signers_line,
    load_signing_key,
    parse_allowed_signers,
    sign,
    sign_file,
    verify,
)
from kvprobe.verdict.verify import verify_verdict

SSH_KEYGEN = shutil.which("ssh-keygen")
# The standard tool is the point of these tests: in CI its absence is a failure, not a skip.
if SSH_KEYGEN is None and os.environ.get("CI"):
    raise RuntimeError("ssh-keygen is not installed: CI must `apt-get install -y openssh-client`")
needs_ssh_keygen = pytest.mark.skipif(SSH_KEYGEN is None, reason="ssh-keygen (openssh-client) not installed")


@pytest.fixture(autouse=True)
def _own_config_dir(tmp_path, monkeypatch):
    """Never touch the user's real key: the default key lives in a temporary config dir."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    for var in ("KVPROBE_SIGNING_KEY", "KVPROBE_ALLOWED_SIGNERS", "KVPROBE_SIGNING_KEY_PASSPHRASE"):
        monkeypatch.delenv(var, raising=False)


def make_key(path: Path, kind: str = "ed25519", passphrase: str = "") -> Path:
    subprocess.run([SSH_KEYGEN, "-q", "-t", kind, "-N", passphrase, "-C", "tester", "-f", str(path)], check=True)
    return path


def ssh_verify(allowed: Path, message: Path, principal: str = "tester") -> subprocess.CompletedProcess:
    with open(message, "rb") as fh:
        return subprocess.run([SSH_KEYGEN, "-Y", "verify", "-f", str(allowed), "-I", principal, "-n", NAMESPACE,
                               "-s", f"{message}.sig"], stdin=fh, capture_output=True, text=True)


@pytest.fixture
def signed_run(tmp_path):
    """A run directory with a verdict signed by an ssh-keygen-made key, and an allowed_signers file."""
    run = Measurements().write(tmp_path / "run")
    write_verdict(run)
    key = load_signing_key(make_key(tmp_path / "id_ed25519"))
    sign_file(run.path / "verdict.json", key)
    allowed = tmp_path / "allowed_signers"
    allowed.write_text(allowed_signers_line("tester", key.key.public_key()) + "\n")
    return run.path, allowed, key


def flip_a_digit(path: Path, key: str = '"word_perplexity": 20.0') -> None:
    data = path.read_bytes()
    assert key.encode() in data
    path.write_bytes(data.replace(key.encode(), key.replace("20.0", "20.3").encode(), 1))


@needs_ssh_keygen
def test_ssh_keygen_accepts_the_signature(signed_run):
    run_dir, allowed, key = signed_run
    result = ssh_verify(allowed, run_dir / "verdict.json")
    assert result.returncode == 0, result.stderr
    assert key.fingerprint in result.stdout + result.stderr
    assert verify_verdict(run_dir, allowed).signer.principals == ["tester"]


@needs_ssh_keygen
def test_kvprobe_accepts_a_signature_made_by_ssh_keygen(tmp_path):
    key_path = make_key(tmp_path / "k")
    message = tmp_path / "m.json"
    message.write_bytes(b'{"a": 1}\n')
    subprocess.run([SSH_KEYGEN, "-Y", "sign", "-f", str(key_path), "-n", NAMESPACE, str(message)],
                   check=True, capture_output=True)
    key = load_signing_key(key_path)
    allowed = parse_allowed_signers(allowed_signers_line("tester", key.key.public_key()))
    signer = verify(message.read_bytes(), Path(f"{message}.sig").read_text(), allowed)
    assert signer.fingerprint == key.fingerprint


@needs_ssh_keygen
def test_one_changed_byte_fails_both_tools(signed_run):
    run_dir, allowed, _ = signed_run
    flip_a_digit(run_dir / "verdict.json")
    assert ssh_verify(allowed, run_dir / "verdict.json").returncode != 0
    with pytest.raises(SignatureError, match="verdict was changed after it was signed"):
        verify_verdict(run_dir, allowed)


@needs_ssh_keygen
def test_edited_numbers_resigned_by_another_key_fail_against_the_allowed_signers(signed_run, tmp_path):
    run_dir, allowed, _ = signed_run
    path = run_dir / "verdict.json"
    verdict = orjson.loads(path.read_bytes())
    verdict["probes"]["perplexity"]["servers"]["cand"]["passage_ll"][0] += 1.0
    path.write_bytes(verdict_bytes(verdict))
    mallory = load_signing_key(make_key(tmp_path / "mallory"))
    sign_file(path, mallory)
    assert ssh_verify(allowed, path).returncode != 0
    with pytest.raises(SignatureError, match=f"signed by {re.escape(mallory.fingerprint)}.*not trusted"):
        verify_verdict(run_dir, allowed)


@needs_ssh_keygen
def test_edited_numbers_resigned_by_the_trusted_key_fail_the_rederivation(signed_run):
    run_dir, allowed, key = signed_run
    path = run_dir / "verdict.json"
    verdict = orjson.loads(path.read_bytes())
    cand = verdict["probes"]["perplexity"]["servers"]["cand"]
    cand["passage_ll"] = [x - 50.0 for x in cand["passage_ll"]]  # 5% more NLL per byte: would be a reject
    path.write_bytes(verdict_bytes(verdict))
    sign_file(path, key)
    assert ssh_verify(allowed, path).returncode == 0  # the signature alone is fine
    with pytest.raises(SignatureError, match="recorded decision 'adopt', the numbers give 'reject'"):
        verify_verdict(run_dir, allowed)


@needs_ssh_keygen
def test_numbers_that_disagree_with_the_probe_files_fail(signed_run):
    run_dir, allowed, _key = signed_run
    data = orjson.loads((run_dir / "perplexity.json").read_bytes())
    data["servers"]["cand"]["word_perplexity"] = 99.0
    (run_dir / "perplexity.json").write_bytes(orjson.dumps(data))
    with pytest.raises(SignatureError, match=r"differ from the run directory's files at "
                                             r"probes\.perplexity\.servers\.cand\.word_perplexity"):
        verify_verdict(run_dir, allowed)


def test_wrong_namespace_is_refused(tmp_path):
    key = load_signing_key()
    allowed = parse_allowed_signers(allowed_signers_line("x", key.key.public_key()))
    armored = sign(b"data", key.key, namespace="file")
    with pytest.raises(SignatureError, match="namespace is 'file'"):
        verify(b"data", armored, allowed)


def test_allowed_signers_namespaces_and_principal_are_enforced():
    key = load_signing_key()
    armored = sign(b"data", key.key)
    line = allowed_signers_line("*@example.org", key.key.public_key())
    allowed = parse_allowed_signers(line)
    assert verify(b"data", armored, allowed, principal="alice@example.org").principals == ["alice@example.org"]
    assert verify(b"data", armored, allowed).principals == ["*@example.org"]
    with pytest.raises(SignatureError, match="as 'bob'"):
        verify(b"data", armored, parse_allowed_signers(line), principal="bob")
    other_ns = line.replace(f'namespaces="{NAMESPACE}"', 'namespaces="git"')
    with pytest.raises(SignatureError, match="not trusted"):
        verify(b"data", armored, parse_allowed_signers(other_ns))
    expired = line.replace(f'namespaces="{NAMESPACE}"', f'namespaces="{NAMESPACE}",valid-before="20000101"')
    with pytest.raises(SignatureError, match="not trusted"):
        verify(b"data", armored, parse_allowed_signers(expired))


def test_default_key_is_created_once_with_0600_and_listed(tmp_path):
    first = load_signing_key()
    assert first.created
    key_file = tmp_path / "config" / "kvprobe" / "signing_key"
    assert first.source == str(key_file)
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(key_file.parent.stat().st_mode) == 0o700
    again = load_signing_key()
    assert not again.created and again.fingerprint == first.fingerprint
    allowed = (tmp_path / "config" / "kvprobe" / "allowed_signers").read_text()
    assert allowed.count("ssh-ed25519") == 1 and f'namespaces="{NAMESPACE}"' in allowed


@needs_ssh_keygen
def test_key_from_the_environment_as_path_or_text(tmp_path, monkeypatch):
    path = make_key(tmp_path / "envkey")
    expected = load_signing_key(path).fingerprint
    monkeypatch.setenv("KVPROBE_SIGNING_KEY", str(path))
    assert load_signing_key().fingerprint == expected
    monkeypatch.setenv("KVPROBE_SIGNING_KEY", path.read_text())
    key = load_signing_key()
    assert key.fingerprint == expected and "PRIVATE" not in key.source


@needs_ssh_keygen
def test_unusable_keys_say_what_to_fix(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="Ed25519 only"):
        load_signing_key(make_key(tmp_path / "rsa", "rsa"))
    locked = make_key(tmp_path / "locked", passphrase="s3cret")
    with pytest.raises(ConfigError, match="passphrase-protected: set KVPROBE_SIGNING_KEY_PASSPHRASE"):
        load_signing_key(locked)
    monkeypatch.setenv("KVPROBE_SIGNING_KEY_PASSPHRASE", "wrong")
    with pytest.raises(ConfigError, match="wrong passphrase"):
        load_signing_key(locked)
    monkeypatch.setenv("KVPROBE_SIGNING_KEY_PASSPHRASE", "s3cret")
    assert load_signing_key(locked).fingerprint.startswith("SHA256:")
    with pytest.raises(ConfigError, match="cannot read the signing key"):
        load_signing_key(tmp_path / "missing")


def test_verify_without_an_allowed_signers_list_says_so(tmp_path):
    run = Measurements().write(tmp_path / "run")
    write_verdict(run)
    (run.path / "verdict.json.sig").write_text(sign((run.path / "verdict.json").read_bytes(),
                                                    load_signing_key().key))
    os.remove(tmp_path / "config" / "kvprobe" / "allowed_signers")
    with pytest.raises(ConfigError, match="no allowed signers file: pass --allowed-signers"):
        verify_verdict(run.path)


@needs_ssh_keygen
def test_verify_command_exit_codes(signed_run):
    run_dir, allowed, _ = signed_run
    runner = CliRunner()
    ok = runner.invoke(main, ["verify", str(run_dir), "--allowed-signers", str(allowed)])
    assert ok.exit_code == 0, ok.output
    assert "signature ok" in ok.output and "decisions re-derived" in ok.output
    as_json = runner.invoke(main, ["verify", str(run_dir), "--allowed-signers", str(allowed), "--json"])
    assert as_json.exit_code == 0, as_json.output
    data = json.loads(as_json.stdout)
    assert data["schema"] == "kvprobe.verify/1" and data["holds"] and data["signature"]["ok"]
    assert data["decisions"] == {n: d["decision"] for n, d in json.loads((run_dir / "verdict.json").read_text())[
        "decisions"].items()}
    flip_a_digit(run_dir / "verdict.json")
    bad = runner.invoke(main, ["verify", str(run_dir / "verdict.json"), "--allowed-signers", str(allowed)])
    assert bad.exit_code == 1
    assert "changed after it was signed" in bad.output
    missing = runner.invoke(main, ["verify", str(run_dir / "nothing")])
    assert missing.exit_code == 2 and "no verdict.json there" in missing.output


@needs_ssh_keygen
def test_verify_json_prints_one_document_on_every_run(signed_run, tmp_path):
    """Holding, untrusted, tampered, unsigned, nothing there: always one kvprobe.verify/1 document with `holds` and
    every reason, and the exit code verify always had."""
    run_dir, allowed, key = signed_run

    def document(target: Path, allowed_signers: Path) -> tuple[int, dict]:
        result = CliRunner().invoke(main, ["verify", str(target), "--allowed-signers", str(allowed_signers), "--json"])
        return result.exit_code, json.loads(result.stdout)

    code, holding = document(run_dir, allowed)
    assert code == 0 and holding["holds"] and holding["reasons"] == [] and holding["signature"]["ok"]
    nobody = tmp_path / "nobody"
    nobody.write_text("")
    code, untrusted = document(run_dir, nobody)
    assert code == 1 and not untrusted["holds"] and "the signer is not trusted" in untrusted["reasons"][0]
    assert untrusted["signature"]["fingerprint"] == key.fingerprint and not untrusted["signature"]["ok"]
    assert untrusted["decisions"] == holding["decisions"]  # as the file says them: `holds` says what they are worth
    flip_a_digit(run_dir / "verdict.json")
    code, tampered = document(run_dir, allowed)
    assert code == 1 and not tampered["holds"]
    assert tampered["reasons"][0] == ("signature does not match the verdict's bytes: the verdict was changed after "
                                      "it was signed")
    assert "differ from the run directory's files at probes.perplexity.servers.cand" in tampered["reasons"][1]
    (run_dir / "verdict.json.sig").unlink()
    code, unsigned = document(run_dir, allowed)
    assert code == 1 and "no signature: the verdict is unsigned" in unsigned["reasons"][0]
    code, missing = document(run_dir / "nothing", allowed)
    assert code == 2 and not missing["holds"] and missing["decisions"] is None
    assert "no verdict.json there" in missing["reasons"][0]


@needs_ssh_keygen
def test_an_untrusted_signer_is_told_the_line_that_trusts_it(signed_run, tmp_path):
    run_dir, _, key = signed_run
    mine = tmp_path / "mine"
    mine.write_text("# nobody yet\n")
    result = CliRunner().invoke(main, ["verify", str(run_dir), "--allowed-signers", str(mine)])
    assert result.exit_code == 1 and key.fingerprint in result.stderr
    (line,) = re.findall(rf"the signer is not trusted; if that key is one you expect, add this line to "
                         rf"{re.escape(str(mine))}: (.+)$", result.stderr, re.M)
    mine.write_text(line + "\n")
    assert CliRunner().invoke(main, ["verify", str(run_dir), "--allowed-signers", str(mine)]).exit_code == 0
    assert ssh_verify(mine, run_dir / "verdict.json", principal="kvprobe-signer").returncode == 0


def test_verify_unsigned_rederives_an_unsigned_run(tmp_path):
    run = Measurements().write(tmp_path / "run")
    write_verdict(run)
    assert CliRunner().invoke(main, ["verify", str(run.path)]).exit_code == 1
    result = CliRunner().invoke(main, ["verify", str(run.path), "--unsigned"])
    assert result.exit_code == 0, result.output
    assert "signature not required (--unsigned): " in result.stdout and "no signature" in result.stdout
    assert "decisions re-derived" in result.stdout and "cand adopt" in result.stdout
    as_json = json.loads(CliRunner().invoke(main, ["verify", str(run.path), "--unsigned", "--json"]).stdout)
    assert as_json["holds"] and as_json["unsigned"] and not as_json["signature"]["ok"]
    assert "no signature" in as_json["signature"]["problem"]
    path = run.path / "verdict.json"
    verdict = orjson.loads(path.read_bytes())
    verdict["decisions"]["cand"]["decision"] = "reject"
    path.write_bytes(verdict_bytes(verdict))
    edited = CliRunner().invoke(main, ["verify", str(run.path), "--unsigned"])
    assert edited.exit_code == 1 and "recorded decision 'reject', the numbers give 'adopt'" in edited.stderr
