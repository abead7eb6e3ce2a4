"""kvserver.auth.passwords: raftkv's scrypt hashes, and etcd's bcrypt hashes that users
moved from etcd keep (the hash below is what etcd 3.4 stored for password ``pw``)."""

from kvserver.auth import passwords

ETCD_HASH_OF_PW = b"$2a$10$Ee2IoX5C6G/78MEd1TsXrOH9HC/1f54Hi4l.ArXJOq5tYViKLQDoS"


def test_scrypt_hash_verifies_its_password_only():
    h = passwords.hash_password("secret", n=1 << 4)
    assert passwords.is_valid_hash(h)
    assert passwords.verify("secret", h, n=1 << 4)
    assert not passwords.verify("other", h, n=1 << 4)


def test_etcd_bcrypt_hash_verifies_as_etcd_does():
    assert passwords.verify("pw", ETCD_HASH_OF_PW)
    assert not passwords.verify("pw2", ETCD_HASH_OF_PW)
    assert not passwords.verify("pw", ETCD_HASH_OF_PW[:-5])  # malformed: no match, no error


def test_empty_hash_never_matches():
    assert not passwords.verify("", b"")  # etcd's user added with --no-password
    assert not passwords.is_valid_hash(ETCD_HASH_OF_PW)  # new hashes are raftkv's own
