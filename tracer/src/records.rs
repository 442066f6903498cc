//! Turns ring-buffer bytes into typed stop events.
