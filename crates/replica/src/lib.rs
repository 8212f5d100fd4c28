//! spindle-replica (being built).
