"""The store conformance suite's properties, run by :func:`rdzv.testing.check_store`
(the public entry point): :mod:`.common` holds its bounds and helpers, :mod:`.keys`
the key-value properties of every :class:`~rdzv.store.Store`, :mod:`.sets` the
member-set properties of a :class:`~rdzv.store.SetStore`."""
