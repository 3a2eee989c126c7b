"""Discovery: the instances an endpoint has, and the stores that publish them (DSC)."""
