"""Calls: func.call and optimization barriers, the custom_call dispatch, host callbacks, and sharding
annotations and collectives (identities on one device)."""
