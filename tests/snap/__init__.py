"""Tests of snap/: snapshot files (DESIGN section 4)."""
