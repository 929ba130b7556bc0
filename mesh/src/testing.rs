//! Test fixtures (owned by the launch work; placeholder).
