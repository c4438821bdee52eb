// 32 activations as the bytes the q4 packed-dot mat-vec multiplies (matvec_q4_dot4.wgsl), with
// matvec_int8_x.wgsl's scale and rounding. Shared by the places that quantize them: the
// mat-vec itself, per workgroup (matvec_q4_dot4_x.wgsl), the quantizer that runs once per
// mat-vec beforehand (quantize_x.wgsl), and decode attention for the o projection
// (attention_decode_xq.wgsl), so all give the same bytes for the same x. The unit they make,
// UnitX, is int8_unit.wgsl; reading a mat-vec input's units, int8_quads.wgsl.

// The even and odd words of q (xy) and of r (zw) for activations 8j .. 8j+7 (quads a = 8j..,
// b = 8j+4..), in nibble order or, `natural`, in natural order (int8_unit.wgsl).
fn pack_pair(a: vec4<f32>, b: vec4<f32>, inverse: f32, natural: bool) -> vec4<u32> {
    let la = int8_lanes(a, inverse);
    let lb = int8_lanes(b, inverse);
    if (natural) {
        return vec4<u32>(pack4xI8(la.q), pack4xI8(lb.q), pack4xI8(la.r), pack4xI8(lb.r));
    }
    return vec4<u32>(pack4xI8(vec4<i32>(la.q.x, la.q.z, lb.q.x, lb.q.z)),
                     pack4xI8(vec4<i32>(la.q.y, la.q.w, lb.q.y, lb.q.w)),
                     pack4xI8(vec4<i32>(la.r.x, la.r.z, lb.r.x, lb.r.z)),
                     pack4xI8(vec4<i32>(la.r.y, la.r.w, lb.r.y, lb.r.w)));
}

// The unit of the 8 quads q (activations 0..31 of the unit, padding already 0), its bytes in
// nibble order or, `natural`, in natural order: the same q and r either way, placed apart.
fn quantize_unit(q: array<vec4<f32>, 8>, natural: bool) -> UnitX {
    let total = dot(((q[0] + q[1]) + (q[2] + q[3])) + ((q[4] + q[5]) + (q[6] + q[7])), vec4<f32>(1.0));
    let big = max(max(max(abs(q[0]), abs(q[1])), max(abs(q[2]), abs(q[3]))),
                  max(max(abs(q[4]), abs(q[5])), max(abs(q[6]), abs(q[7]))));
    let d = int8_scale(quad_max(big));
    let w0 = pack_pair(q[0], q[1], d.inverse, natural);
    let w1 = pack_pair(q[2], q[3], d.inverse, natural);
    let w2 = pack_pair(q[4], q[5], d.inverse, natural);
    let w3 = pack_pair(q[6], q[7], d.inverse, natural);
    return UnitX(vec4<u32>(w0.x, w1.x, w2.x, w3.x), vec4<u32>(w0.y, w1.y, w2.y, w3.y),
                 vec4<u32>(w0.z, w1.z, w2.z, w3.z), vec4<u32>(w0.w, w1.w, w2.w, w3.w), d.scale, total);
}
