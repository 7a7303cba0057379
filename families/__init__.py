"""Model families (data), shipped as package data `bundler.family_data`; see families/<name>/."""
