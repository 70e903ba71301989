//! Links the addon the way Node loads it (napi-build's settings).

fn main() {
    napi_build::setup();
}
