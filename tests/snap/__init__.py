"""Tests of snap/: snapshot files."""
