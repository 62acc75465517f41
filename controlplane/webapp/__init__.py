"""A built browser app (Agent Canvas) served from this origin, and the calls it makes to log in."""
