//! Starting processes on hosts (owned by the launch work; placeholder).
