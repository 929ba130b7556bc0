//! The controller: owns the run (dataset cursor, dispatch, ledger, staleness, supervision).
