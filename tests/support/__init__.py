"""Helpers the tests share: no test module imports another test module, they import these."""
