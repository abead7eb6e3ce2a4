"""etcd v3 authentication and role-based access: ``store`` (replicated users, roles,
permissions), ``perms`` (key-range checks), ``tokens`` (simple tokens, brute-force bound),
``passwords`` (scrypt hashes), ``service`` (one member's checks), ``errors`` (etcd's texts)."""

from .service import AuthService

__all__ = ["AuthService"]
