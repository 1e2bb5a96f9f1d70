//! Sans-IO STUN/TURN server core: bytes and `now` in, responses and relay actions out.
