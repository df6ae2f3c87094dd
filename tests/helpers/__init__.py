"""Code the tests share: launchers, reference implementations, MPI scenario scripts (no tests)."""
