//! Starts the whole join system as real processes (filled in by the harness work).
