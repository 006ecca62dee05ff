#pragma once
// GBNF, llama.cpp's grammar notation, parsed into a Grammar (expr.h):
//   rule ::= "literal" [a-z] [^"\\] . ( group ) other-rule | alternative
// with postfix * + ? {m} {m,} {m,n} {,n}, escapes \n \r \t \\ \" \] \xHH \uHHHH \UHHHHHHHH, and # comments.
// The root rule is `root`.
#include <string_view>

#include "grammar/expr.h"

namespace promptly::grammar {

// Throws GrammarError (compile.h) with the line and column of the problem.
Grammar parse_gbnf(std::string_view text, std::string_view root = "root");

}  // namespace promptly::grammar
