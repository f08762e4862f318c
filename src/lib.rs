//! wspush
