//! `lastcall`: the termination lifecycle shared by lastcall's daemons.
