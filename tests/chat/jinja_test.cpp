#include "chat/jinja.h"

#include <gtest/gtest.h>

namespace promptly::jinja {
namespace {

std::string render(const std::string& src, const std::string& json_vars = "{}") {
  Dict globals;
  const auto vars = nlohmann::ordered_json::parse(json_vars);
  for (const auto& [k, v] : vars.items()) globals.set(k, Value::from_json(v));
  return Template(src).render(globals);
}

TEST(Jinja, WhitespaceControlAsHuggingFaceConfiguresIt) {
  EXPECT_EQ(render("a\n{% if true %}\nb\n{% endif %}\nc"), "a\nb\nc");      // trim_blocks
  EXPECT_EQ(render("a\n    {% if true %}b{% endif %}"), "a\nb");            // lstrip_blocks
  EXPECT_EQ(render("a  {%- if true -%}  b  {%- endif %}"), "ab");           // explicit '-'
  EXPECT_EQ(render("x {{ 1 }}\n{{ 2 }}"), "x 1\n2");                        // no trimming after {{ }}
  EXPECT_EQ(render("a\n  {%+ if true %}b{% endif %}"), "a\n  b");           // '+' keeps the indent
  EXPECT_EQ(render("line\n"), "line");                                       // trailing newline dropped
  EXPECT_EQ(render("a {# note #}\nb"), "a b");
  EXPECT_EQ(render("{% raw %}{{ not evaluated }}{% endraw %}"), "{{ not evaluated }}");
}

TEST(Jinja, ExpressionsFollowPython) {
  EXPECT_EQ(render("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }}"), "3 -4 1 2 3.5 1024");
  EXPECT_EQ(render("{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 'a' ~ 1 ~ none }}"), "7 9 a1None");
  EXPECT_EQ(render("{{ true }} {{ none }} {{ 1.0 }} {{ 0.1 }} {{ 1e20 }} {{ [1, 'a', none] }} {{ {'k': \"it's\"} }}"),
            "True None 1.0 0.1 1e+20 [1, 'a', None] {'k': \"it's\"}");
  EXPECT_EQ(render("{{ 'yes' if 1 < 2 < 3 else 'no' }} {{ 'x' if false }}."), "yes .");
  EXPECT_EQ(render("{{ 'b' in 'abc' }} {{ 2 not in [1, 2] }} {{ 'k' in {'k': 1} }}"), "True False True");
  EXPECT_EQ(render("{{ x[1:] }} {{ x[::-1] }} {{ x[-1] }} {{ s[1:3] }} {{ s[::-1] }}", R"({"x":[1,2,3],"s":"h\u00e9llo"})"),
            "[2, 3] [3, 2, 1] 3 \xc3\xa9l oll\xc3\xa9h");
  EXPECT_EQ(render("{{ m.a }}{{ m['b'] }}{{ m.missing }}|{{ m.get('z', 'dflt') }}", R"({"m":{"a":1,"b":2}})"), "12|dflt");
}

TEST(Jinja, LoopsAndScopes) {
  EXPECT_EQ(render("{% for x in xs %}{{ loop.index }}{{ x }}{% if not loop.last %},{% endif %}{% endfor %}", R"({"xs":["a","b"]})"),
            "1a,2b");
  EXPECT_EQ(render("{% for x in [] %}y{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for x in range(10) if x is odd %}{% if x > 5 %}{% break %}{% endif %}{{ x }}{% endfor %}"), "135");
  EXPECT_EQ(render("{% for k, v in d|items %}{{ k }}={{ v }};{% endfor %}", R"({"d":{"b":1,"a":2}})"), "b=1;a=2;");
  // `set` inside a loop does not leak; namespace attributes do.
  EXPECT_EQ(render("{% set n = 0 %}{% set ns = namespace(n=0) %}{% for i in range(3) %}{% set n = n + 1 %}"
                   "{% set ns.n = ns.n + 1 %}{% endfor %}{{ n }} {{ ns.n }}"),
            "0 3");
  EXPECT_EQ(render("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', punct='?') }}"),
            "Hi A! Hi B?");
  EXPECT_EQ(render("{% set block %}x{{ 1 + 1 }}{% endset %}[{{ block }}]"), "[x2]");
}

TEST(Jinja, FiltersAndTests) {
  EXPECT_EQ(render("{{ '  a b  ' | trim }}|{{ 'abc' | upper }}|{{ [3,1,2] | sort | join(',') }}|{{ 'x' | length }}"), "a b|ABC|1,2,3|1");
  EXPECT_EQ(render("{{ users | selectattr('role', 'equalto', 'user') | map(attribute='name') | list }}",
                   R"({"users":[{"role":"user","name":"a"},{"role":"bot","name":"b"}]})"),
            "['a']");
  EXPECT_EQ(render("{{ xs | reject('equalto', 2) | list }} {{ xs | first }} {{ xs | last }} {{ xs | sum }}", R"({"xs":[1,2,3]})"),
            "[1, 3] 1 3 6");
  EXPECT_EQ(render("{{ {'b': [1, 2], 'a': 'é\"'} | tojson }}"), "{\"b\": [1, 2], \"a\": \"é\\\"\"}");
  EXPECT_EQ(render("{{ {'a': [1]} | tojson(indent=2) }}"), "{\n  \"a\": [\n    1\n  ]\n}");
  EXPECT_EQ(render("{{ undefined_var | default('d') }} {{ '' | default('e', true) }}"), "d e");
  EXPECT_EQ(render("{{ x is defined }} {{ y is not defined }} {{ 'a' is string }} {{ {} is mapping }} {{ 4 is divisibleby 2 }}",
                   R"({"x":1})"),
            "True True True True True");
  EXPECT_EQ(render("{{ 'a,b,,c'.split(',') }} {{ ' x y '.split() }} {{ 'xxhixx'.strip('x') }} {{ 'Hello'.startswith('He') }}"),
            "['a', 'b', '', 'c'] ['x', 'y'] hi True");
  EXPECT_EQ(render("{{ 'a\nb' | indent(2) }}|{{ 'hello world' | title }}|{{ 'x' * 3 }}"), "a\n  b|Hello World|xxx");
}

TEST(Jinja, ErrorsAreClearAndNameTheLine) {
  auto error_of = [](const std::string& src, const std::string& vars = "{}") -> std::string {
    try {
      render(src, vars);
    } catch (const TemplateError& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_NE(error_of("a\n{% if x %}").find("line 2"), std::string::npos);
  EXPECT_NE(error_of("{% frobnicate %}").find("unsupported statement 'frobnicate'"), std::string::npos);
  EXPECT_NE(error_of("{{ x | nosuchfilter }}").find("unknown filter 'nosuchfilter'"), std::string::npos);
  EXPECT_NE(error_of("\n\n{{ a.b }}").find("line 3: 'a' is undefined"), std::string::npos);
  EXPECT_NE(error_of("{{ 1 + 'a' }}").find("unsupported operand"), std::string::npos);
  EXPECT_NE(error_of("{{ 'unterminated }}").find("unclosed '{{'"), std::string::npos);
  EXPECT_NE(error_of("{% set x = 'a %}{{ x }}").find("unclosed"), std::string::npos);
  EXPECT_THROW(render("{{ raise_exception('nope') }}"), RaisedException);
  EXPECT_NE(error_of("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}").find("execution budget"),
            std::string::npos);
  EXPECT_NE(error_of("{% set ns = namespace(a=1) %}{% set ns.me = [ns] %}").find("inside itself"), std::string::npos);
  EXPECT_NE(error_of("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}").find("nested deeper"), std::string::npos);
  try {
    render("{{ raise_exception('Roles must alternate') }}");
  } catch (const RaisedException& e) {
    EXPECT_STREQ(e.what(), "Roles must alternate");
  }
}

}  // namespace
}  // namespace promptly::jinja
