//! spindle-rt (being built).
