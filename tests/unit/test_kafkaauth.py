"""The SASL mechanism servers (logstore.kafka.auth): SCRAM-SHA-256 against RFC 7677's published
exchange, SCRAM-SHA-512 round trips with a client written here from RFC 5802, unknown users
failing exactly as a wrong password, malformed messages, PLAIN (RFC 4616)."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from logstore.kafka.auth import PlainServer, SaslAuthenticationError, SaslAuthenticator, ScramServer
from logstore.kafka.credentials import Credentials, plain_credential, scram_credential

# RFC 7677, section 3: user "user", password "pencil".
RFC_CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC_SERVER_FIRST = b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
RFC_CLIENT_FINAL = (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
RFC_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
SECRET = b"k" * 32


def rfc_credentials():
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    return Credentials({("user", "SCRAM-SHA-256"): scram_credential("SCRAM-SHA-256", "pencil", salt, 4096)})


def test_scram_sha_256_matches_rfc_7677():
    server = ScramServer("SCRAM-SHA-256", rfc_credentials().lookup, SECRET, server_nonce=RFC_SERVER_NONCE)
    assert server.step(RFC_CLIENT_FIRST) == RFC_SERVER_FIRST
    assert not server.done
    assert server.step(RFC_CLIENT_FINAL) == RFC_SERVER_FINAL
    assert server.done and server.user == "user"
    with pytest.raises(SaslAuthenticationError):
        server.step(RFC_CLIENT_FINAL)


def test_rfc_7677_with_one_bit_of_the_proof_flipped_fails():
    server = ScramServer("SCRAM-SHA-256", rfc_credentials().lookup, SECRET, server_nonce=RFC_SERVER_NONCE)
    server.step(RFC_CLIENT_FIRST)
    proof = bytearray(base64.b64decode(RFC_CLIENT_FINAL.rpartition(b"p=")[2]))
    proof[0] ^= 1
    with pytest.raises(SaslAuthenticationError, match="invalid credentials with SASL mechanism SCRAM-SHA-256"):
        server.step(RFC_CLIENT_FINAL.rpartition(b"p=")[0] + b"p=" + base64.b64encode(bytes(proof)))
    assert not server.done


def client_exchange(server, mechanism, user, password, gs2=b"n,,", nonce="clientnonce0123", final_nonce=None):
    """A client written from RFC 5802; returns (server-final, the signature expected in it)."""
    name = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}[mechanism]
    bare = f"n={user.replace('=', '=3D').replace(',', '=2C')},r={nonce}"
    server_first = server.step(gs2 + bare.encode()).decode()
    attrs = dict(a.split("=", 1) for a in server_first.split(","))
    assert attrs["r"].startswith(nonce)
    salted = hashlib.pbkdf2_hmac(name, password.encode(), base64.b64decode(attrs["s"]), int(attrs["i"]))
    client_key = hmac.new(salted, b"Client Key", name).digest()
    sent_nonce = attrs["r"] if final_nonce is None else final_nonce(nonce, attrs["r"])
    without_proof = f"c={base64.b64encode(gs2).decode()},r={sent_nonce}"
    auth = f"{bare},{server_first},{without_proof}".encode()
    signature = hmac.new(hashlib.new(name, client_key).digest(), auth, name).digest()
    proof = base64.b64encode(bytes(a ^ b for a, b in zip(client_key, signature))).decode()
    final = server.step(f"{without_proof},p={proof}".encode())
    expected = b"v=" + base64.b64encode(hmac.new(hmac.new(salted, b"Server Key", name).digest(), auth, name).digest())
    return final, expected


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
@pytest.mark.parametrize("user", ["alice", "b,o=b", "zoë"])
def test_scram_round_trip(mechanism, user):
    credentials = Credentials({(user, mechanism): scram_credential(mechanism, "pässword", iterations=5000)})
    server = ScramServer(mechanism, credentials.lookup, SECRET)
    final, expected = client_exchange(server, mechanism, user, "pässword")
    assert final == expected and server.done and server.user == user


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_accepts_the_doubled_client_nonce_of_old_librdkafka_and_nothing_else(mechanism):
    """librdkafka before 2.6.1 (Debian's kcat) sends its nonce again before the whole one in
    its client-final message (librdkafka#4895); Kafka 3.8.1-3.9 accept that form, so this
    server does. Any other nonce is refused."""
    credentials = Credentials({("alice", mechanism): scram_credential(mechanism, "pw")})
    server = ScramServer(mechanism, credentials.lookup, SECRET)
    final, expected = client_exchange(server, mechanism, "alice", "pw", final_nonce=lambda mine, whole: mine + whole)
    assert final == expected and server.done
    for tampered in (lambda mine, whole: whole + mine, lambda mine, whole: "x" + whole,
                     lambda mine, whole: mine + mine + whole, lambda mine, whole: whole[:-1]):
        server = ScramServer(mechanism, credentials.lookup, SECRET)
        with pytest.raises(SaslAuthenticationError, match="invalid nonce"):
            client_exchange(server, mechanism, "alice", "pw", final_nonce=tampered)
        assert not server.done


def test_scram_with_y_flag_and_matching_authzid():
    credentials = Credentials({("alice", "SCRAM-SHA-512"): scram_credential("SCRAM-SHA-512", "pw")})
    for gs2 in (b"y,,", b"n,a=alice,"):
        server = ScramServer("SCRAM-SHA-512", credentials.lookup, SECRET)
        final, expected = client_exchange(server, "SCRAM-SHA-512", "alice", "pw", gs2=gs2)
        assert final == expected


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_unknown_user_fails_like_a_wrong_password(mechanism):
    credentials = Credentials({("alice", mechanism): scram_credential(mechanism, "right")})
    messages, salts = [], []
    for user, password in [("alice", "wrong"), ("nobody", "right"), ("nobody", "right")]:
        server = ScramServer(mechanism, credentials.lookup, SECRET)
        first = server.step(f"n,,n={user},r=abc".encode()).decode()
        salts.append(dict(a.split("=", 1) for a in first.split(","))["s"])
        assert first.endswith(",i=4096")
        with pytest.raises(SaslAuthenticationError) as failed:
            client_exchange(ScramServer(mechanism, credentials.lookup, SECRET), mechanism, user, password)
        messages.append(str(failed.value))
    assert len(set(messages)) == 1 and mechanism in messages[0]
    assert salts[1] == salts[2] != salts[0]  # an unknown user's salt is stable
    assert len(base64.b64decode(salts[1])) == len(base64.b64decode(salts[0]))


def test_a_user_with_only_another_mechanism_is_unknown_for_this_one():
    credentials = Credentials({("alice", "SCRAM-SHA-256"): scram_credential("SCRAM-SHA-256", "pw")})
    with pytest.raises(SaslAuthenticationError, match="invalid credentials"):
        client_exchange(ScramServer("SCRAM-SHA-512", credentials.lookup, SECRET), "SCRAM-SHA-512", "alice", "pw")


@pytest.mark.parametrize("first", [
    b"p=tls-unique,,n=alice,r=abc",      # channel binding required
    b"n,,r=abc,n=alice",                 # attributes out of order
    b"n,,m=ext,n=alice,r=abc",           # a mandatory extension
    b"n,,n=al=41ce,r=abc",               # a bad saslname escape
    b"n,,n=,r=abc",                      # an empty user
    b"n,,n=alice,r=",                    # an empty nonce
    b"n,a=bob,n=alice,r=abc",            # another authzid
    b"n,,n=alice,r=abc,tokenauth=true",  # delegation tokens
    b"garbage",
    b"\xff\xfe",
])
def test_malformed_client_first_messages_fail(first):
    credentials = Credentials({("alice", "SCRAM-SHA-256"): scram_credential("SCRAM-SHA-256", "pw")})
    server = ScramServer("SCRAM-SHA-256", credentials.lookup, SECRET)
    with pytest.raises(SaslAuthenticationError, match="^Authentication failed"):
        server.step(first)


def test_an_unknown_extension_is_ignored_as_kafka_does():
    credentials = Credentials({("alice", "SCRAM-SHA-256"): scram_credential("SCRAM-SHA-256", "pw")})
    server = ScramServer("SCRAM-SHA-256", credentials.lookup, SECRET)
    assert server.step(b"n,,n=alice,r=abc,ext=1").startswith(b"r=abc")


def test_plain():
    credentials = Credentials({("alice", "PLAIN"): plain_credential("wonder land")})
    assert PlainServer(credentials.lookup).step(b"\0alice\0wonder land") == b""
    server = PlainServer(credentials.lookup)
    server.step(b"alice\0alice\0wonder land")  # an authzid equal to the user
    assert server.done and server.user == "alice"
    with pytest.raises(SaslAuthenticationError):
        server.step(b"\0alice\0wonder land")  # one token only
    refusals = [b"\0alice\0wrong", b"\0nobody\0wonder land", b"bob\0alice\0wonder land", b"\0alice\0",
                b"\0\0wonder land", b"alice\0wonder land", b"\0alice\0wonder land\0", b"\0al\xffice\0x"]
    messages = set()
    for token in refusals:
        with pytest.raises(SaslAuthenticationError) as failed:
            PlainServer(credentials.lookup).step(token)
        messages.add(str(failed.value))
    assert "Authentication failed: invalid credentials with SASL mechanism PLAIN" in messages


def test_authenticator_settings():
    with pytest.raises(ValueError):
        SaslAuthenticator({"a": "b"}, ["GSSAPI"])
    with pytest.raises(ValueError):
        SaslAuthenticator({"a": "b"}, [])
    auth = SaslAuthenticator({"alice": "pw"}, ["SCRAM-SHA-512"])
    assert auth.mechanisms == ("SCRAM-SHA-512",)
    assert sorted(auth.credentials().entries()) == [("alice", "SCRAM-SHA-512")]  # derived for enabled ones only
    assert isinstance(auth.mechanism("SCRAM-SHA-512"), ScramServer)
