# The functions of one object file (OBJ: how its path ends) that ran, from a callgrind profile
# made with --demangle=no. "ob=(id) name", "cob=…", "fn=…" and "cfn=…" name an id the first
# time it appears; later lines give the id alone. callgrind names a function's recursive
# activations "name'2", "name'3", …: those are the function itself, no symbol of the binary.
/^c?ob=/ {
    line = $0; is_call = (substr(line, 1, 1) == "c"); sub(/^c?ob=/, "", line)
    id = line; sub(/ .*/, "", id); name = substr(line, length(id) + 2)
    if (name != "") obs[id] = name
    if (!is_call) ob = obs[id]
    next
}
/^c?fn=/ {
    line = $0; is_call = (substr(line, 1, 1) == "c"); sub(/^c?fn=/, "", line)
    id = line; sub(/ .*/, "", id); name = substr(line, length(id) + 2)
    if (name != "") fns[id] = name
    f = fns[id]; sub(/'[0-9]+$/, "", f)
    if (!is_call && ob ~ (OBJ "$") && f !~ /^0x/ && f != "(below main)" && !(f in seen)) {
        seen[f] = 1; print f
    }
}
