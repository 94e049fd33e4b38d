"""gather, scatter and dynamic_slice / dynamic_update_slice, with XLA's out-of-bounds rules."""
