// Decode mat-vec weights in f16 read 16 bytes at a time, for matvec_main.wgsl (registry
// variant "f16_wide"). For rows of whole 16-byte runs only: K % 8 == 0 (the host's check).
//
//   w  [rows][units] vec4<u32>   8 f16 per unit, two per word (row_words = 4 units)
//   then the activations and y from X_BINDING on (matvec_input_*.wgsl)
//
// matvec_f16.wgsl serves any K: a row there starts only 4-byte aligned, so it reads four
// scalar words per unit, clamps each index and masks every unit. Here a unit is one
// vec4<u32> load and, K being a multiple of 8, no unit is partial: no clamps, no masks.
// f16 -> f32 is exact (unpack2x16float), so no shader-f16 feature is needed.

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;
const X_BINDING: u32 = 2u;        // the first binding of the input file

// A unit of x: 8 activations.
struct UnitX {
    q: array<vec4<f32>, 2>,
}

fn load_x(u: u32, m: u32) -> UnitX {
    return UnitX(array<vec4<f32>, 2>(x_full(m, 2u * u), x_full(m, 2u * u + 1u)));
}

// Row `row`'s share of unit u.
fn row_dot(xu: UnitX, u: u32, row: u32) -> f32 {
    let v = w[row * params.units + u];
    return dot(vec4<f32>(unpack2x16float(v.x), unpack2x16float(v.y)), xu.q[0])
         + dot(vec4<f32>(unpack2x16float(v.z), unpack2x16float(v.w)), xu.q[1]);
}
