"""An API server for harnesses (``kproxy cluster serve``): manifests served with list and watch,
discovery as far as kubectl needs it, and the ``pods/portforward`` subresource."""
