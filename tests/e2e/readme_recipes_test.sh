#!/usr/bin/env bash
# Runs the debugging recipes of README.md ("Talk to it with buf curl") exactly as written, against
# a real server, and checks their output against what the README shows, so that the two cannot
# drift. A recipe is the ```sh block after a `<!-- recipe:NAME -->` line: its command lines run
# verbatim (the `S=...` line is replaced by this test's socket; `buf` is the project-local buf);
# its `# ...` lines are the output shown.
#
#   tests/e2e/readme_recipes_test.sh
#
# Checks: list and describe print every line shown; base64 prints exactly the string shown; the
# JSON recipes (health, server-info, sample, sample-seeded) answer with the fields listed below,
# and the README shows those same fields.
# Every recipe must have a check here, and every check its recipe in the README.
set -uo pipefail
# shellcheck source=deploy/local/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../deploy/local/lib.sh"

readonly README="${SAMPLERD_README:-${SAMPLERD_ROOT}/README.md}"  # env: a README to check
E2E_NAME=recipes
# shellcheck source=tests/e2e/e2e_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/e2e_lib.sh"

# Fragments (whitespace removed) each JSON recipe's output must contain.
declare -A JSON_CHECKS=(
  [health]='"status":"SERVING"'
  [server-info]='"backend":"BACKEND_CPU" "version":" "maxInflight":"256" "chunkTimeoutMs":"10000" "maxRegionBytes":"4398046511104" "maxRegions":"4096"'
  [sample]='"tokenIds":[2,0] "rowStatus":["ROW_STATUS_OK","ROW_STATUS_OK"]'
  [sample-seeded]='"requestId":"step-7" "tokenIds":[2] "seeds":["42"] "sampledRank":"1" "topTokenIds":[2,3]'
)
# Recipes whose every shown line (but "...") must appear as a line of the output.
readonly LINE_RECIPES=" list describe base64 "

# Splits README.md's recipes into $TMP/recipes/NAME.{cmd,expected}.
extract_recipes() {
  mkdir -p "${TMP}/recipes"
  awk -v dir="${TMP}/recipes" '
    match($0, /^<!-- recipe:[a-z0-9-]+ -->$/) {
      name = substr($0, 13, length($0) - 16); want = 1; next
    }
    want && /^```sh$/ { inblock = 1; want = 0; printf "" > (dir "/" name ".cmd"); next }
    inblock && /^```$/ { inblock = 0; next }
    inblock && /^# / { print substr($0, 3) > (dir "/" name ".expected"); next }
    inblock && /^S=/ { next }
    inblock { print > (dir "/" name ".cmd") }
  ' "${README}"
}

# run_recipe NAME: runs its commands with S = our socket and buf = the project-local buf.
run_recipe() {
  (
    # shellcheck disable=SC2034  # S is used by the recipe text.
    S="${SOCK}"
    buf() { timeout "${CALL_TIMEOUT_S}" "${SAMPLERD_BUF}" "$@"; }
    eval "$(cat "${TMP}/recipes/$1.cmd")"
  ) >"${TMP}/out" 2>"${TMP}/err"
}

check_recipe() {
  local name="$1" rc line frag missing=()
  run_recipe "${name}"
  rc=$?
  if ((rc != 0)); then fail "recipe ${name}" "exit code ${rc}"; return; fi
  if [[ "${LINE_RECIPES}" == *" ${name} "* ]]; then
    [[ -s "${TMP}/recipes/${name}.expected" ]] || { fail "recipe ${name}" "no output shown"; return; }
    while IFS= read -r line; do
      [[ "${line}" == "..." ]] && continue
      grep -qFx -- "${line}" "${TMP}/out" || missing+=("${line}")
    done <"${TMP}/recipes/${name}.expected"
  elif [[ -n "${JSON_CHECKS[${name}]+set}" ]]; then
    local out shown
    out="$(tr -d ' \t\n' <"${TMP}/out")"
    shown="$(tr -d ' \t\n' <"${TMP}/recipes/${name}.expected" 2>/dev/null)"
    for frag in ${JSON_CHECKS[${name}]}; do
      [[ "${out}" == *"${frag}"* ]] || missing+=("${frag}")
      # The README must show what the server answers: the same fragment in its output lines.
      [[ "${shown}" == *"${frag}"* ]] || missing+=("${frag} (in the README's shown output)")
    done
  else
    fail "recipe ${name}" "README recipe without a check in this test"
    return
  fi
  if ((${#missing[@]})); then fail "recipe ${name}" "output lacks ${missing[*]}"
  else pass "recipe ${name}"
  fi
}

main() {
  extract_recipes
  local name found=" "
  for f in "${TMP}"/recipes/*.cmd; do
    [[ -e "${f}" ]] || break
    found+="$(basename "${f}" .cmd) "
  done
  for name in list describe base64 "${!JSON_CHECKS[@]}"; do
    [[ "${found}" == *" ${name} "* ]] || fail "recipe ${name}" "not found in README.md"
  done
  echo "recipes in README.md:${found}"
  if start_server; then
    for name in ${found}; do check_recipe "${name}"; done
  fi
  echo "readme recipes: ${PASSED} passed, ${FAILED} failed"
  ((FAILED == 0))
}

main "$@"
