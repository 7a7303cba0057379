"""Deployment targets beyond `bundle serve`: files that existing serving engines read.

`triton` writes a Triton model repository, `kserve` writes KServe manifests. Both only
read bundles and write files (atomically); nothing here changes the bundle format.
"""
