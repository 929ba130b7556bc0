//! Collectives (all-reduce, broadcast, reduce-scatter, all-gather, barrier) behind one interface.
